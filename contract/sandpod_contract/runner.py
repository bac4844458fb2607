"""The runner protocol (docs/runner-protocol.md): its frames and its result, read with
bounded memory.

The pod log carries one JSON object per line: output frames, then a result line. The
termination message carries the same result (without diagnostics when it would not fit).
`FrameDecoder` turns log bytes into frames (the gateway streams the output ones);
`LogReader` keeps only the tail of each stream (the operator's status holds a bounded amount).
"""

import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

Stream = Literal["stdout", "stderr"]

# The runner frames reads of a few KiB; a line longer than this is not one of its frames.
MAX_FRAME_BYTES = 4 * 1024 * 1024


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


@dataclass(frozen=True)
class OutputChunk:
    """An output frame: text the program wrote to one of its streams."""

    stream: Stream
    data: str


@dataclass(frozen=True)
class ResultFrame:
    """The result line; `result` is None when its object is not a result."""

    result: RunnerResult | None


@dataclass(frozen=True)
class Unframed:
    """A line that is not a frame (a runner crash, a missing runner)."""

    line: bytes


Frame = OutputChunk | ResultFrame | Unframed


def decode_line(line: bytes) -> Frame:
    """One log line -> the frame it is."""
    try:
        frame = json.loads(line)
    except ValueError:
        return Unframed(line)
    if isinstance(frame, dict):
        stream, data = frame.get("stream"), frame.get("data")
        if stream in ("stdout", "stderr") and isinstance(data, str):
            return OutputChunk(stream=stream, data=data)
        if "result" in frame:
            return ResultFrame(RunnerResult.from_json(frame["result"]))
    return Unframed(line)


def decode_frame(line: bytes) -> OutputChunk | None:
    """One log line -> an output chunk; None for the result line and anything unframed."""
    frame = decode_line(line)
    return frame if isinstance(frame, OutputChunk) else None


class LineSplitter:
    """Log bytes, split anywhere, -> complete lines; a line over MAX_FRAME_BYTES is skipped."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        self._pending += data
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            if self._skipping:
                self._skipping = False
                continue
            lines.append(line)
        if len(self._pending) > MAX_FRAME_BYTES:
            self._pending.clear()
            self._skipping = True
        return lines

    def finish(self) -> list[bytes]:
        """A last line that had no newline, if any."""
        line, self._pending = bytes(self._pending), bytearray()
        return [] if self._skipping or not line else [line]


class FrameDecoder:
    """Log bytes, split anywhere, -> the output chunks of its complete lines (live streaming)."""

    def __init__(self) -> None:
        self._lines = LineSplitter()

    def feed(self, data: bytes) -> list[OutputChunk]:
        return self._chunks(self._lines.feed(data))

    def finish(self) -> list[OutputChunk]:
        """Chunks from a last line that had no newline."""
        return self._chunks(self._lines.finish())

    @staticmethod
    def _chunks(lines: list[bytes]) -> list[OutputChunk]:
        return [chunk for line in lines if (chunk := decode_frame(line)) is not None]


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
        self._lines = LineSplitter()
        self._result: RunnerResult | None = None

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        frame = decode_line(line)
        if isinstance(frame, OutputChunk):
            (self._stdout if frame.stream == "stdout" else self._stderr).add(frame.data)
        elif isinstance(frame, ResultFrame):
            self._result = frame.result
        else:
            self._stderr.add(line.decode(errors="replace") + "\n")

    def finish(self) -> LogSummary:
        for line in self._lines.finish():
            self._line(line)
        return LogSummary(
            stdout=self._stdout.text(),
            stderr=self._stderr.text(),
            stdout_clipped=self._stdout.dropped,
            stderr_clipped=self._stderr.dropped,
            result=self._result,
        )
