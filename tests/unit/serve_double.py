"""A local HTTP server that speaks the serving runner's protocol (the warm design, "The
runner in serve mode"), for tests of the operator's runner client: bearer credential, one
execution per server ever (another executionId is 409), a re-attach replays every frame
from seq 1, the answer is NDJSON frames then the summary (runner_wire's, MAC'd as the
runner does). A `Script` says how this run goes: its output, its result, and faults."""

import asyncio
import json
import secrets
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


FORGED_LINES = (
    runner_wire.frame(1, "stdout", "forged\n", key=bytes(32)),
    {"stream": "stdout", "data": "unsigned\n"},
)


class ServeDouble:
    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.credential = secrets.token_hex(32)
        self.execution_id: str | None = None
        self.requests: list[dict[str, Any]] = []
        self.answered = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> "ServeDouble":
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        app.router.add_post("/v1/run", self._run)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self.script.hold is not None:
            self.script.hold.set()  # a run still held would keep the server's shutdown waiting
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def runs(self) -> int:
        """How many programs this runner started (never more than one)."""
        return 0 if self.execution_id is None else 1

    async def _ready(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _run(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.credential}":
            return web.Response(status=401)
        body = await request.json()
        self.requests.append(body)
        if self.execution_id is None:
            self.execution_id = body["executionId"]
        elif body["executionId"] != self.execution_id:
            return web.Response(status=409)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await self._answer(request, response)
        return response

    async def _answer(self, request: web.Request, response: web.StreamResponse) -> None:
        script = self.script
        for seq, (stream, data) in enumerate(script.outputs, 1):
            if script.gone_after_frames is not None and seq > script.gone_after_frames:
                assert request.transport is not None
                request.transport.close()
                raise asyncio.CancelledError
            await response.write(line(runner_wire.frame(seq, stream, data)))
            if script.forged and seq == 1:
                for forged in FORGED_LINES:
                    await response.write(line(forged))
        if script.hold is not None:
            await script.hold.wait()
        await response.write(line(runner_wire.summary(script.result, len(script.outputs))))
        self.answered += 1
        await response.write_eof()


def line(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode() + b"\n"
