"""Telling the kubelet when kopf has stopped running handlers.

kopf holds every handler until each watch it has started has listed its objects once. A watch
stopped before its first listing (with namespace patterns: a matching namespace deleted just
after it appeared) never lets go, and the operator then runs no handler at all while its
process looks healthy. The liveness probe (handlers.handlers_run) fails when:
- no handler has run `after` seconds after the start (the node's first event comes right
  after the first listings), or
- the resync touched an execution (itself an event) and no handler ran for it within `after`.
The kubelet then restarts the operator, which lists everything afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StallDetector:
    def __init__(self, after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._after = after
        self._clock = clock
        self._started = clock()
        self._any_ran = False
        self._touched: dict[str, float] = {}

    def handler_ran(self, uid: str | None = None) -> None:
        """A handler ran (for the execution `uid`, when given)."""
        self._any_ran = True
        if uid is not None:
            self._touched.pop(uid, None)

    def any_ran(self) -> bool:
        """Whether a handler has run: kopf runs none before every index is populated."""
        return self._any_ran

    def touched(self, uid: str) -> None:
        """The resync touched the execution `uid`: a handler must see it."""
        self._touched.setdefault(uid, self._clock())

    def stalled(self) -> str | None:
        """Why the operator looks stalled, or None."""
        now = self._clock()
        if not self._any_ran and now - self._started >= self._after:
            return f"no handler has run in the {self._after:g} s since the operator started"
        for uid, at in self._touched.items():
            if now - at >= self._after:
                return f"no handler saw execution {uid} in the {self._after:g} s since its touch"
        return None
