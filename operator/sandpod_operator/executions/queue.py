"""The executions queue: executions created queued (label QUEUED_LABEL, by the gateway for a
Judge0 submission beyond its tenant's maxConcurrent) wait here until the tenant runs fewer
than that many; then the label comes off and the operator's handlers start them as any other.

Fair between tenants: a tenant's queue is released against its own running executions only,
so another tenant's backlog never holds it back, and each pass releases round-robin, one
execution per tenant in turn (oldest first within a tenant), so the sandboxes of two tenants'
batches start interleaved. The queue's state is the cluster's (labels, read through kopf's
indexes): an operator restart loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sandpod_operator.kube import API_ERRORS

log = logging.getLogger(__name__)

Tenant = tuple[str, str]  # (namespace, tenant)


@dataclass(frozen=True, order=True)
class Waiting:
    """A queued execution as the index holds it (ordered by creation, then name)."""

    created: str
    name: str
    uid: str
    limit: int


def queue_limit(value: str | None) -> int:
    """The label's value: the tenant's maxConcurrent; 1 when it is not a positive number
    (whoever could write the label can only slow their own executions down)."""
    return int(value) if value and value.isdigit() and int(value) > 0 else 1


def releases(
    waiting: Mapping[Tenant, Iterable[Waiting]],
    running: Mapping[Tenant, int],
    released: Iterable[str],
) -> list[tuple[Tenant, Waiting]]:
    """The queued executions to start now, in order: round-robin over the tenants (the one
    waiting longest first), each while it runs fewer than its limit (`released`: uids let go
    already but still shown queued, counted as running)."""
    let_go = set(released)
    queues: dict[Tenant, list[Waiting]] = {}
    room: dict[Tenant, int] = {}
    for tenant, entries in waiting.items():
        queue = sorted(entries)
        pending = [entry for entry in queue if entry.uid not in let_go]
        if not pending:
            continue
        busy = running.get(tenant, 0) + (len(queue) - len(pending))
        room[tenant] = pending[0].limit - busy
        queues[tenant] = pending
    order = sorted(queues, key=lambda tenant: queues[tenant][0])
    chosen: list[tuple[Tenant, Waiting]] = []
    while any(room[tenant] > 0 and queues[tenant] for tenant in order):
        for tenant in order:
            if room[tenant] > 0 and queues[tenant]:
                chosen.append((tenant, queues[tenant].pop(0)))
                room[tenant] -= 1
    return chosen


class Releaser(Protocol):
    async def release_execution(self, namespace: str, name: str, *, uid: str) -> bool: ...


class ExecutionQueue:
    """Releases queued executions whenever an execution changes (wake), from kopf's indexes
    of the queued and the running ones."""

    def __init__(
        self,
        kube: Releaser,
        waiting: Mapping[Tenant, Iterable[Waiting]],
        running: Mapping[Tenant, Iterable[str]],
    ) -> None:
        self._kube = kube
        self._waiting = waiting
        self._running = running
        self._woken = asyncio.Event()
        # Released, but the index still shows them queued: they count as running.
        self._released: set[str] = set()

    def wake(self) -> None:
        self._woken.set()

    async def run(self, backstop_seconds: float) -> None:
        """Forever: a pass after each wake (and every `backstop_seconds`, for a failed
        release)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), backstop_seconds)
            self._woken.clear()
            await self.release_due()

    async def release_due(self) -> None:
        queued = {uid for entries in self._waiting.values() for uid in _uids(entries)}
        self._released &= queued
        running = {tenant: len(list(names)) for tenant, names in self._running.items()}
        for (namespace, _tenant), entry in releases(self._waiting, running, self._released):
            try:
                await self._kube.release_execution(namespace, entry.name, uid=entry.uid)
            except API_ERRORS as error:  # tried again on the next pass
                log.warning("releasing %s/%s failed: %s", namespace, entry.name, error)
                continue
            self._released.add(entry.uid)


def _uids(entries: Iterable[Waiting]) -> Iterable[str]:
    return (entry.uid for entry in entries)
