"""Reading what the runner reports (docs/runner-protocol.md), with bounded memory.

The pod log carries one JSON object per line: output frames, then a result line. The
termination message carries the same result (without diagnostics when it would not fit).
Only the tail of each stream is kept: status holds a bounded amount.
"""

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

# The runner frames reads of a few KiB; a line longer than this is not one of its frames.
MAX_LINE_BYTES = 4 * 1024 * 1024


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunnerResult:
    """The runner's summary of one run."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    duration_ms: int | None
    stdout_truncated: bool
    stderr_truncated: bool
    peak_memory_bytes: int | None
    diagnostics: list[dict[str, Any]] | None
    error: str | None

    @classmethod
    def from_json(cls, data: Any) -> "RunnerResult | None":
        """Tolerant parse: None for anything that is not a result object."""
        if not isinstance(data, dict):
            return None
        diagnostics = data.get("diagnostics")
        error = data.get("error")
        return cls(
            exit_code=_int_or_none(data.get("exitCode")),
            signal=_int_or_none(data.get("signal")),
            timed_out=data.get("timedOut") is True,
            duration_ms=_int_or_none(data.get("durationMs")),
            stdout_truncated=data.get("stdoutTruncated") is True,
            stderr_truncated=data.get("stderrTruncated") is True,
            peak_memory_bytes=_int_or_none(data.get("peakMemoryBytes")),
            diagnostics=(
                [d for d in diagnostics if isinstance(d, dict)]
                if isinstance(diagnostics, list)
                else None
            ),
            error=error if isinstance(error, str) and error else None,
        )


def parse_termination_message(text: str | None) -> RunnerResult | None:
    """The result object the runner wrote to /dev/termination-log, if it did."""
    if not text:
        return None
    try:
        return RunnerResult.from_json(json.loads(text))
    except ValueError:
        return None


class Tail:
    """The last `limit` UTF-8 bytes of a text stream, and whether anything was dropped."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.dropped = False

    def add(self, text: str) -> None:
        data = text.encode()
        self._chunks.append(data)
        self._size += len(data)
        while self._chunks and self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.popleft())
            self.dropped = True

    def text(self) -> str:
        data = b"".join(self._chunks)
        if len(data) > self._limit:
            data = data[len(data) - self._limit :]
            self.dropped = True
        # A cut may split a character: drop its leftover continuation bytes at the start.
        return data.decode(errors="ignore") if self.dropped else data.decode()


@dataclass(frozen=True)
class LogSummary:
    stdout: str
    stderr: str
    stdout_clipped: bool
    stderr_clipped: bool
    result: RunnerResult | None


class LogReader:
    """Feed pod log bytes as they arrive (split anywhere); read the summary at the end.

    Lines that are not frames (a runner crash, a missing runner) go to stderr, so that
    whatever the sandbox said is not lost.
    """

    def __init__(self, tail_bytes: int) -> None:
        self._stdout = Tail(tail_bytes)
        self._stderr = Tail(tail_bytes)
        self._pending = bytearray()
        self._skipping_long_line = False
        self._result: RunnerResult | None = None

    def feed(self, data: bytes) -> None:
        self._pending += data
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            if self._skipping_long_line:
                self._skipping_long_line = False
                continue
            self._line(line)
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending.clear()
            self._skipping_long_line = True

    def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            frame = json.loads(line)
        except ValueError:
            frame = None
        if isinstance(frame, dict):
            stream, data = frame.get("stream"), frame.get("data")
            if isinstance(data, str) and stream in ("stdout", "stderr"):
                (self._stdout if stream == "stdout" else self._stderr).add(data)
                return
            if "result" in frame:
                self._result = RunnerResult.from_json(frame["result"])
                return
        self._stderr.add(line.decode(errors="replace") + "\n")

    def finish(self) -> LogSummary:
        if self._pending and not self._skipping_long_line:
            self._line(bytes(self._pending))
        self._pending.clear()
        return LogSummary(
            stdout=self._stdout.text(),
            stderr=self._stderr.text(),
            stdout_clipped=self._stdout.dropped,
            stderr_clipped=self._stderr.dropped,
            result=self._result,
        )
