"""A resync for executions the operator has seen but never started.

kopf is event-driven: when an API server restart leaves it with a stale copy of an execution
(its own last patch never comes back through the watch), nothing happens to that execution
until its watch is re-listed, which may take an hour. The operator keeps an index of the
executions it has seen without a status (handlers.unstarted_executions) and touches each
one that stays so for `resync_after_seconds`: the change comes back as a new event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta

from sandpod_operator.kube import API_ERRORS, Kube

log = logging.getLogger(__name__)

Unstarted = tuple[str, str]  # (uid, creationTimestamp)


def due(
    seen: Mapping[tuple[str, str], Iterable[Unstarted]], now: datetime, after: timedelta
) -> list[tuple[str, str, str]]:
    """(namespace, name, uid) of each execution seen unstarted for at least `after`."""
    found = []
    for (namespace, name), entries in seen.items():
        for uid, created in entries:
            if created and now - datetime.fromisoformat(created) >= after:
                found.append((namespace, name, uid))
    return found


async def resync_unstarted(
    seen: Mapping[tuple[str, str], Iterable[Unstarted]],
    kube: Kube,
    after_seconds: float,
    on_touch: Callable[[str], None],
) -> None:
    """Forever: every `after_seconds`, touch the executions `due` (`on_touch(uid)` after
    each touch)."""
    after = timedelta(seconds=after_seconds)
    while True:
        await asyncio.sleep(after_seconds)
        now = datetime.now(UTC)
        for namespace, name, uid in due(seen, now, after):
            log.warning("execution %s/%s has no status yet: looking at it again", namespace, name)
            try:
                if await kube.touch_execution(namespace, name, uid=uid, at=now.isoformat()):
                    on_touch(uid)
            except API_ERRORS as error:  # retried next round
                log.warning("touching %s/%s failed: %s", namespace, name, error)
