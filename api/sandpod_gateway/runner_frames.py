"""Decoding the runner's framed pod log (docs/runner-protocol.md) into output chunks."""

import json
from dataclasses import dataclass
from typing import Literal

Stream = Literal["stdout", "stderr"]

# A frame longer than this is not the runner's (it frames reads of a few KiB); skip it.
MAX_FRAME_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class OutputChunk:
    stream: Stream
    data: str


def decode_frame(line: bytes) -> OutputChunk | None:
    """One log line -> an output chunk; None for the result line and anything unframed."""
    try:
        frame = json.loads(line)
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    stream, data = frame.get("stream"), frame.get("data")
    if stream in ("stdout", "stderr") and isinstance(data, str):
        return OutputChunk(stream=stream, data=data)
    return None


class FrameDecoder:
    """Turns log bytes, split anywhere, into output chunks, one complete line at a time."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[OutputChunk]:
        chunks: list[OutputChunk] = []
        self._pending += data
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            if self._skipping:
                self._skipping = False
                continue
            if (chunk := decode_frame(line)) is not None:
                chunks.append(chunk)
        if len(self._pending) > MAX_FRAME_BYTES:
            self._pending.clear()
            self._skipping = True
        return chunks

    def finish(self) -> list[OutputChunk]:
        """Chunks from a last line that had no newline."""
        line, self._pending = bytes(self._pending), bytearray()
        if self._skipping or not line:
            return []
        chunk = decode_frame(line)
        return [chunk] if chunk is not None else []
