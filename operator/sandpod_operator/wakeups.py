"""Wake a per-object daemon at once when something about its object changed."""

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Wakeups:
    events: dict[Hashable, asyncio.Event] = field(default_factory=dict)

    def poke(self, key: Hashable) -> None:
        """Something about `key` changed: its daemon's next pass runs now."""
        self.events.setdefault(key, asyncio.Event()).set()

    async def wait(self, key: Hashable, timeout: float) -> None:
        """Until `key` is poked, or `timeout` seconds."""
        wakeup = self.events.setdefault(key, asyncio.Event())
        try:
            await asyncio.wait_for(wakeup.wait(), max(timeout, 0))
        except TimeoutError:
            return
        finally:
            wakeup.clear()

    def forget(self, key: Hashable) -> None:
        self.events.pop(key, None)
