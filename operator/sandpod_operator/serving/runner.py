"""A client of the serving runner (docs/runner-protocol.md, "Serve mode"): POST /v1/run and
read its NDJSON answer, verified with the contract's decoder.

The answer is the run's MAC'd frames, then the runner's summary, which reveals the key they
were made with. Lines are kept (at most `limit_bytes`) until the summary arrives, then fed to
`sandpod_contract.runner.LogReader` under it: the one decoder of the runner's wire format.
"""

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from sandpod_contract.runner import (
    LineSplitter,
    LogReader,
    LogSummary,
    OutputListener,
    Summary,
    decode_frame,
    parse_summary,
)

RUN_PATH = "/v1/run"
CANCEL_PATH = "/v1/cancel"
CHUNK_BYTES = 64 * 1024


class RunnerUnavailable(Exception):
    """The runner did not give a whole answer: unreachable, refused (401, 409, ...), or the
    answer ended before its summary. `why` is for logs and metrics, never for a status."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class RunnerRefused(RunnerUnavailable):
    """The runner refused to start the run (409: it runs another): the program did not run,
    so another sandbox may take it; this one serves on."""


class RunnerRetired(RunnerRefused):
    """The runner takes no further run (410): the program did not run there; its sandbox is
    to be replaced."""


@dataclass(frozen=True)
class RunnerAddress:
    host: str
    port: int

    def url(self, path: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"


class _Answer:
    """The answer's lines until the summary, bounded: past `limit_bytes` lines are not kept
    (the decoder then counts the frames it did not see as missing). `on_output` sees each
    output frame before the summary, unverified."""

    def __init__(self, limit_bytes: int, on_output: OutputListener | None = None) -> None:
        self._lines = LineSplitter()
        self._kept: list[bytes] = []
        self._room = limit_bytes
        self._on_output = on_output
        self.summary: Summary | None = None

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            if self.summary is not None:
                return
            self.summary = parse_summary(line.decode(errors="replace"))
            if self.summary is None and self._on_output is not None:
                chunk = decode_frame(line)
                if chunk is not None:
                    self._on_output(chunk)
            if self.summary is not None or len(line) < self._room:
                self._kept.append(line)
                self._room -= len(line) + 1

    def verified(self, tail_bytes: int, files_bytes: int) -> LogSummary:
        assert self.summary is not None
        reader = LogReader(tail_bytes, self.summary, files_bytes)
        reader.feed(b"".join(line + b"\n" for line in self._kept))
        return reader.finish()


async def run(
    session: aiohttp.ClientSession,
    address: RunnerAddress,
    credential: str,
    request: dict[str, Any],
    *,
    tail_bytes: int,
    limit_bytes: int,
    files_bytes: int = 0,
    marks: dict[str, float] | None = None,
    on_output: OutputListener | None = None,
) -> LogSummary:
    """Start (or re-attach to: same executionId) the run and wait for its verified answer.
    `marks` gets the wall-clock times of the answer's milestones (posted, answered,
    first_frame, summary), for the operator's timing log; `on_output` the output as it comes."""
    headers = {"Authorization": f"Bearer {credential}"}
    answer = _Answer(limit_bytes, on_output)
    marks = {} if marks is None else marks
    try:
        marks["posted"] = time.time()
        async with session.post(address.url(RUN_PATH), json=request, headers=headers) as response:
            marks["answered"] = time.time()
            if response.status == 409:
                raise RunnerRefused("HTTP 409")
            if response.status == 410:
                raise RunnerRetired("HTTP 410")
            if response.status != 200:
                raise RunnerUnavailable(f"HTTP {response.status}")
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                marks.setdefault("first_frame", time.time())
                answer.feed(chunk)
                if answer.summary is not None:
                    marks["summary"] = time.time()
                    break
    except aiohttp.ClientError as error:
        raise RunnerUnavailable(type(error).__name__) from error
    if answer.summary is None:
        raise RunnerUnavailable("the answer ended before the summary")
    return answer.verified(tail_bytes, files_bytes)


async def cancel(
    session: aiohttp.ClientSession, address: RunnerAddress, credential: str, execution_id: str
) -> bool:
    """Ask the runner to stop the run of `execution_id`: True if it was in progress there
    (its answer then ends with `cancelled`), False if it had no such run in progress."""
    headers = {"Authorization": f"Bearer {credential}"}
    body = {"executionId": execution_id}
    try:
        async with session.post(address.url(CANCEL_PATH), json=body, headers=headers) as response:
            if response.status == 409:
                return False
            if response.status != 202:
                raise RunnerUnavailable(f"HTTP {response.status}")
            return True
    except aiohttp.ClientError as error:
        raise RunnerUnavailable(type(error).__name__) from error
