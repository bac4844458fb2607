"""A local HTTP server that speaks the serving runner's protocol (the warm design, "The
runner in serve mode", and the session design's `--session`), for tests of the operator's
runner client: bearer credential, a re-attach replays every frame from seq 1, the answer is
NDJSON frames then the summary (runner_wire's, MAC'd as the runner does). Serve mode: one
execution per server ever (another executionId is 409 while it runs, 410 after). `many`:
many, one at a time, up to `max_runs` (then 410). Session mode: many, one at a time
(another executionId while one runs is 409). POST /v1/cancel ends the run in progress.
A `Script` says how a run goes: its output, its result, and faults; in session mode each
new run takes the next of `scripts`."""

import asyncio
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import runner_wire
from aiohttp import web


@dataclass
class Script:
    outputs: list[tuple[str, str]] = field(default_factory=lambda: [("stdout", "hi\n")])
    result: dict[str, Any] = field(default_factory=runner_wire.result)
    # The runner dies after writing this many frames (the connection breaks, no summary).
    gone_after_frames: int | None = None
    # Lines written among the genuine frames: a frame under another key, an unsigned one.
    forged: bool = False
    # Set: the summary waits for it (the program is still running).
    hold: asyncio.Event | None = None
    # Called while the program runs (before its summary): what it does to the world.
    during: Callable[[], None] | None = None


FORGED_LINES = (
    runner_wire.frame(1, "stdout", "forged\n", key=bytes(32)),
    {"stream": "stdout", "data": "unsigned\n"},
)


class ServeDouble:
    def __init__(
        self,
        script: Script | None = None,
        *,
        session: bool = False,
        many: bool = False,
        max_runs: int | None = None,
        scripts: list[Script] | None = None,
    ) -> None:
        self.script = script or Script()
        self.session = session
        # Serve mode: many runs one after another (a boxed sandbox), else one, ever.
        self.many = many
        self.max_runs = max_runs
        self.cancelled: set[str] = set()
        self.scripts = list(scripts or [])
        self.credential = secrets.token_hex(32)
        # The executionIds it ran, in order, and the script each followed.
        self.executions: list[str] = []
        self.followed: dict[str, Script] = {}
        self.running: str | None = None
        self.requests: list[dict[str, Any]] = []
        self.answered = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def execution_id(self) -> str | None:
        return self.executions[0] if self.executions else None

    @execution_id.setter
    def execution_id(self, value: str) -> None:
        """Someone else's run was bound to this runner."""
        self.executions = [value]
        self.followed[value] = self.script

    async def start(self) -> "ServeDouble":
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        app.router.add_post("/v1/run", self._run)
        app.router.add_post("/v1/cancel", self._cancel)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        for script in [self.script, *self.scripts, *self.followed.values()]:
            if script.hold is not None:
                script.hold.set()  # a run still held would keep the server's shutdown waiting
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def runs(self) -> int:
        """How many programs this runner started (never more than one in serve mode)."""
        return len(self.executions)

    async def _ready(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _run(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.credential}":
            return web.Response(status=401)
        body = await request.json()
        self.requests.append(body)
        execution_id = body["executionId"]
        if execution_id not in self.followed:
            if self.running is not None:
                return web.Response(status=409)
            if self._retired():
                return web.Response(status=410)
            self.executions.append(execution_id)
            self.followed[execution_id] = self.scripts.pop(0) if self.scripts else self.script
        self.running = execution_id
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            await self._answer(request, response, self.followed[execution_id])
        finally:
            if self.running == execution_id:
                self.running = None
        return response

    def _retired(self) -> bool:
        if self.session:
            return False
        most = self.max_runs if self.many else 1
        return most is not None and len(self.executions) >= most

    async def _cancel(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.credential}":
            return web.Response(status=401)
        execution_id = (await request.json())["executionId"]
        if self.running != execution_id:
            return web.Response(status=409)
        self.cancelled.add(execution_id)
        hold = self.followed[execution_id].hold
        if hold is not None:
            hold.set()
        return web.Response(status=202)

    async def _answer(
        self, request: web.Request, response: web.StreamResponse, script: Script
    ) -> None:
        for seq, (stream, data) in enumerate(script.outputs, 1):
            if script.gone_after_frames is not None and seq > script.gone_after_frames:
                assert request.transport is not None
                request.transport.close()
                raise asyncio.CancelledError
            await response.write(line(runner_wire.frame(seq, stream, data)))
            if script.forged and seq == 1:
                for forged in FORGED_LINES:
                    await response.write(line(forged))
        if script.during is not None:
            script.during()
        if script.hold is not None:
            await script.hold.wait()
        result = script.result
        if not self.session and (not self.many or len(self.executions) == self.max_runs):
            result = {**result, "retiring": True}  # as a runner that serves no more says
        if self.running in self.cancelled:
            result = {**result, "cancelled": True}
        await response.write(line(runner_wire.summary(result, len(script.outputs))))
        self.answered += 1
        await response.write_eof()


def line(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode() + b"\n"
