"""The runner protocol (docs/runner-protocol.md): its frames and its summary, read with
bounded memory.

The pod log carries one JSON object per line: output frames (numbered, each with a MAC
under a per-run key only the runner knows until the end), then the summary, which reveals
the key. The termination message carries the same summary. The sandboxed program can write
into both (it runs as the runner's user), so nothing in them is believed unless the kubelet
saw the runner exit 0 (it does so only after writing its summary) and the frames verify.

`FrameDecoder` turns log bytes into frames for live streaming (provisional: unverifiable
before the summary), `LiveOutput` hands them on while the run goes on; `parse_summary` reads
a termination message; `LogReader` keeps the tail of each stream of the verified frames and
finds the runner's summary in the log.
"""

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from sandpod_contract.file_names import name_problem

Stream = Literal["stdout", "stderr"]
# The stream of a file frame: "file:<path in the outputs directory>".
FILE_STREAM_PREFIX = "file:"

# The runner frames reads of at most 8 KiB (48 KiB escaped); a longer line is not its frame.
MAX_FRAME_BYTES = 4 * 1024 * 1024
FRAME_MAC_DOMAIN = b"sandpod-frame-v1"
FRAME_MAC_BYTES = 16
# The runner's own error text is short (the termination message holds at most 4 KiB).
MAX_ERROR_CHARS = 16 * 1024
# A session run's trailing value is bounded by the runner (64 KiB); more is not its own.
MAX_VALUE_CHARS = 128 * 1024
# The runner keeps the first 16 KiB the compiler writes.
MAX_COMPILE_OUTPUT_CHARS = 16 * 1024
# Escaped as \u003c etc. by the API server's JSON encoder (Python's escapes neither).
_HTML_ESCAPED = ("<", ">", "&")


class OutputFile(BaseModel):
    """A file the program left in its outputs directory, as the runner listed it."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )

    path: str = Field(min_length=1, max_length=255)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    media_type: str = Field(min_length=1, max_length=127)


class _ProcessOutcome(BaseModel):
    """How a process the runner started ended: the program, or the compile step."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )

    exit_code: int | None = Field(ge=0, le=255)
    signal: int | None = Field(ge=1, le=64)
    timed_out: bool
    duration_ms: int = Field(ge=0)


class CompileResult(_ProcessOutcome):
    """The compile step's outcome (`result.compile`), for languages with a compileCommand."""

    output: str = Field(max_length=MAX_COMPILE_OUTPUT_CHARS)
    output_truncated: bool

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


class RunnerResult(_ProcessOutcome):
    """The runner's result object (the `result` of its summary), validated strictly."""

    stdout_bytes: int = Field(ge=0)
    stderr_bytes: int = Field(ge=0)
    stdout_truncated: bool
    stderr_truncated: bool
    peak_memory_bytes: int | None = Field(ge=0)
    # The runner killed the run when the memory it held (its processes' and its scratch
    # files') passed the config's memoryLimitBytes, which it names here.
    memory_exceeded: bool = False
    memory_limit_bytes: int | None = Field(default=None, ge=0)
    diagnostics: list[dict[str, Any]] | None
    error: str | None = Field(max_length=MAX_ERROR_CHARS)
    # Python: the trailing expression's repr, as the program's interpreter reported it (the
    # bootstrap of a one-off or pool run, or a session's kernel); session mode only: whether
    # the interpreter was restarted (state lost) by or before this run.
    value: str | None = Field(default=None, max_length=MAX_VALUE_CHARS)
    state_lost: bool = False
    # Session mode only: the run went through the session's Python kernel, so its result is
    # the kernel's word (which earlier runs of the session can have changed).
    kernel: bool = False
    # Serve and session mode: a cancel (POST /v1/cancel) stopped the run before it ended.
    cancelled: bool = False
    # Serve mode: the sandbox takes no further run (it serves one, or its runs or age are used
    # up, or this run left something behind).
    retiring: bool = False
    compile: CompileResult | None = None

    # Absent from runners older than the outputs directory.
    outputs: list[OutputFile] | None = None
    outputs_truncated: bool = False
    outputs_skipped: int = Field(default=0, ge=0)

    def agrees_with(self, shortened: "RunnerResult") -> bool:
        """The log's copy against the termination message's (whose diagnostics, outputs,
        value and compiler output may have been dropped and whose error may have been
        shortened, ending in an ellipsis, to fit)."""
        for dropped in ("diagnostics", "outputs", "value"):
            told = getattr(shortened, dropped)
            if told is not None and told != getattr(self, dropped):
                return False
        if not _compile_agrees(self.compile, shortened.compile):
            return False
        told = shortened.error
        if told != self.error and (
            told is None or not told.endswith("…") or not (self.error or "").startswith(told[:-1])
        ):
            return False
        same = {"diagnostics", "outputs", "value", "error", "compile"}
        return self.model_dump(exclude=same) == shortened.model_dump(exclude=same)


def _compile_agrees(full: CompileResult | None, shortened: CompileResult | None) -> bool:
    if full is None or shortened is None:
        return full is shortened
    if shortened.output not in ("", full.output):
        return False
    return full.model_copy(update={"output": ""}) == shortened.model_copy(update={"output": ""})


class Summary(BaseModel):
    """The runner's last word: its result, how many frames it wrote, and their key."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    result: RunnerResult
    frames: int = Field(ge=0)
    key: str = Field(pattern=r"^[0-9a-f]{64}$")


class _Frame(BaseModel):
    """An output frame exactly as the runner writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    seq: int = Field(ge=1)
    stream: str = Field(pattern=r"^(stdout|stderr|file:.+)$")
    data: str
    mac: str


def frame_mac(key: bytes, seq: int, stream: str, data: str) -> str:
    """Lowercase hex of the first 16 bytes of the frame's HMAC-SHA256 (the runner's)."""
    message = b"\x00".join(
        (
            FRAME_MAC_DOMAIN,
            str(seq).encode(),
            stream.encode(),
            data.encode("utf-8", "surrogatepass"),
        )
    )
    return hmac.new(key, message, hashlib.sha256).digest()[:FRAME_MAC_BYTES].hex()


def parse_summary(text: str | None) -> Summary | None:
    """The summary in a termination message, or None if it is not one."""
    if not text:
        return None
    try:
        return Summary.model_validate_json(text)
    except ValidationError:
        return None


@dataclass(frozen=True)
class OutputChunk:
    """An output frame: text the program wrote to one of its streams."""

    stream: Stream
    data: str


# Sees each chunk of a run's output as it comes, unverified (live output; the verified
# answer follows).
OutputListener = Callable[[OutputChunk], None]


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        frame = json.loads(line)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


def decode_frame(line: bytes) -> OutputChunk | None:
    """One log line -> an output chunk, unverified (live output); None for anything else."""
    frame = _json_object(line)
    if frame is None:
        return None
    stream, data = frame.get("stream"), frame.get("data")
    if stream in ("stdout", "stderr") and isinstance(data, str):
        return OutputChunk(stream=stream, data=data)
    return None


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


def run_started(line: bytes) -> str | None:
    """The execution id of a run's start line in a serving pod's log, else None."""
    record = _json_object(line)
    run = record.get("run") if record is not None else None
    execution_id = run.get("executionId") if isinstance(run, dict) else None
    return execution_id if isinstance(execution_id, str) else None


class FrameDecoder:
    """Log bytes, split anywhere, -> the output chunks of its complete lines (live streaming).

    With `execution_id` (a pod that serves many runs, one after another), only the chunks
    between that run's start line and its summary; `ended` once the summary came."""

    def __init__(self, execution_id: str | None = None) -> None:
        self._lines = LineSplitter()
        self._execution_id = execution_id
        self._inside = execution_id is None
        self.ended = False

    def feed(self, data: bytes) -> list[OutputChunk]:
        return self._chunks(self._lines.feed(data))

    def finish(self) -> list[OutputChunk]:
        """Chunks from a last line that had no newline."""
        return self._chunks(self._lines.finish())

    def _chunks(self, lines: list[bytes]) -> list[OutputChunk]:
        chunks: list[OutputChunk] = []
        for line in lines:
            if self.ended:
                break
            if self._execution_id is not None and not self._inside:
                self._inside = run_started(line) == self._execution_id
            elif (chunk := decode_frame(line)) is not None:
                chunks.append(chunk)
            elif self._execution_id is not None and parse_summary(line.decode("utf-8", "replace")):
                self.ended = True
        return chunks


class LiveOutput:
    """A run's output as it comes (`put` is its listener), read while the run goes on."""

    def __init__(self) -> None:
        self._chunks: deque[OutputChunk] = deque()
        self._arrived = asyncio.Event()

    def put(self, chunk: OutputChunk) -> None:
        self._chunks.append(chunk)
        self._arrived.set()

    async def started(self, run: "asyncio.Future[Any]") -> bool:
        """Once there is output or the run has ended: whether output came while it went on."""
        await self._until_more(run)
        return not run.done()

    async def chunks(self, run: "asyncio.Future[Any]") -> AsyncIterator[OutputChunk]:
        """Every chunk, as it comes, until the run has ended. A reader that stops early (its
        caller went away) leaves the run to end on its own."""
        try:
            while True:
                while self._chunks:
                    yield self._chunks.popleft()
                if run.done():
                    return
                await self._until_more(run)
        finally:
            run.add_done_callback(_outcome_retrieved)

    async def _until_more(self, run: "asyncio.Future[Any]") -> None:
        if self._chunks:
            return
        self._arrived.clear()
        arriving = asyncio.ensure_future(self._arrived.wait())
        try:
            await asyncio.wait({run, arriving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            arriving.cancel()


def _outcome_retrieved(run: "asyncio.Future[Any]") -> None:
    if not run.cancelled():
        run.exception()


def json_size(text: str) -> int:
    """The most bytes `text` takes as a JSON string body in a status write or in etcd: a
    control character is 6 bytes (\\u0000), non-ASCII up to 12 (the client's \\uXXXX pairs)."""
    escaped = len(json.dumps(text)) - 2
    return escaped + 5 * sum(text.count(char) for char in _HTML_ESCAPED)


class Tail:
    """The end of a text stream that takes at most `limit` bytes JSON-encoded, and whether
    anything was dropped."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[tuple[str, int]] = deque()
        self._size = 0
        self.dropped = False

    def add(self, text: str) -> None:
        size = json_size(text)
        self._chunks.append((text, size))
        self._size += size
        while self._chunks and self._size - self._chunks[0][1] >= self._limit:
            self._size -= self._chunks.popleft()[1]
            self.dropped = True

    def text(self) -> str:
        text = "".join(chunk for chunk, _ in self._chunks)
        if self._size <= self._limit:
            return text
        self.dropped = True
        # The shortest cut from the start that fits (sizes only shrink as the cut moves on).
        low, high = 0, len(text)
        while low < high:
            middle = (low + high) // 2
            if json_size(text[middle:]) <= self._limit:
                high = middle
            else:
                low = middle + 1
        return text[low:]


@dataclass(frozen=True)
class VerifiedFile:
    """An output file whose frames verified and whose bytes match the runner's listing.
    `content` is None when it was not kept (past the reader's `files_bytes`)."""

    path: str
    size: int
    sha256: str
    media_type: str
    content: bytes | None


class _FileAssembly:
    """One file's frames as they arrive: size and digest always, bytes while there is room."""

    def __init__(self) -> None:
        self.size = 0
        self.digest = hashlib.sha256()
        self.content: bytearray | None = bytearray()
        self.broken = False

    def add(self, data: str, room: int) -> int:
        """Add a chunk (base64); the bytes of room it took."""
        try:
            chunk = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            self.broken = True
            return 0
        self.size += len(chunk)
        self.digest.update(chunk)
        if self.content is not None and len(chunk) <= room:
            self.content += chunk
            return len(chunk)
        self.content = None
        return 0

    def verified(self, listed: OutputFile) -> VerifiedFile | None:
        if self.broken or self.size != listed.size or self.digest.hexdigest() != listed.sha256:
            return None
        content = None if self.content is None else bytes(self.content)
        return VerifiedFile(listed.path, listed.size, listed.sha256, listed.media_type, content)


@dataclass(frozen=True)
class LogSummary:
    """What the pod log says, verified: output tails and the runner's result.

    `result` is None when the log holds no summary with the key, or one that disagrees with
    the termination message's; `dropped_lines` counts lines that did not verify (forged or
    replayed frames, anything else written into the log); `missing_frames` counts frames the
    runner wrote that the log no longer has.
    """

    stdout: str
    stderr: str
    stdout_clipped: bool
    stderr_clipped: bool
    result: RunnerResult | None
    dropped_lines: int = 0
    missing_frames: int = 0
    files: tuple[VerifiedFile, ...] = ()
    dropped_files: int = 0


class LogReader:
    """Feed pod log bytes as they arrive (split anywhere); read the summary at the end.

    Only frames whose MAC verifies under the summary's key, in increasing sequence (a gap is
    a lost piece of the log; a repeat or step back is a replay), become output. Reading stops
    at the first summary with the key: nothing can have been written by the runner after it.
    File frames are reassembled per path; the bytes of at most `files_bytes` are kept; a file
    whose name the file name rule refuses (sandpod_contract.file_names) is dropped.
    """

    def __init__(self, tail_bytes: int, summary: Summary, files_bytes: int = 0) -> None:
        self._summary = summary
        self._files: dict[str, _FileAssembly] = {}
        self._files_room = files_bytes
        self._key = bytes.fromhex(summary.key)
        self._stdout = Tail(tail_bytes)
        self._stderr = Tail(tail_bytes)
        self._lines = LineSplitter()
        self._last_seq = 0
        self._verified = 0
        self._dropped = 0
        self._result: RunnerResult | None = None
        self._done = False

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            self._line(line)

    def _line(self, line: bytes) -> None:
        if self._done or not line.strip():
            return
        try:
            frame = _Frame.model_validate_json(line)
        except ValidationError:
            self._summary_line(line)
            return
        expected = frame_mac(self._key, frame.seq, frame.stream, frame.data)
        if frame.seq <= self._last_seq or not hmac.compare_digest(expected, frame.mac):
            self._dropped += 1
            return
        self._last_seq, self._verified = frame.seq, self._verified + 1
        if frame.stream.startswith(FILE_STREAM_PREFIX):
            path = frame.stream.removeprefix(FILE_STREAM_PREFIX)
            if name_problem(path) is not None:
                return
            assembly = self._files.setdefault(path, _FileAssembly())
            self._files_room -= assembly.add(frame.data, self._files_room)
            return
        (self._stdout if frame.stream == "stdout" else self._stderr).add(frame.data)

    def _verified_files(self) -> tuple[tuple[VerifiedFile, ...], int]:
        """The listed files whose frames add up to the listing, and how many did not. A name
        the file name rule refuses is dropped (the runner never lists one)."""
        listed = (self._result.outputs if self._result else None) or []
        files = []
        for entry in listed:
            if name_problem(entry.path) is not None:
                continue
            assembly = self._files.get(entry.path, _FileAssembly())
            if (verified := assembly.verified(entry)) is not None:
                files.append(verified)
        return tuple(files), len(listed) - len(files)

    def _summary_line(self, line: bytes) -> None:
        try:
            found = Summary.model_validate_json(line)
        except ValidationError:
            self._dropped += 1
            return
        if not hmac.compare_digest(found.key, self._summary.key):
            self._dropped += 1
            return
        self._done = True
        told = self._summary
        if found.frames == told.frames and found.result.agrees_with(told.result):
            self._result = found.result

    def finish(self) -> LogSummary:
        for line in self._lines.finish():
            self._line(line)
        missing = max(0, self._summary.frames - self._verified) if self._result else 0
        files, dropped_files = self._verified_files()
        return LogSummary(
            stdout=self._stdout.text(),
            stderr=self._stderr.text(),
            stdout_clipped=self._stdout.dropped or missing > 0,
            stderr_clipped=self._stderr.dropped or missing > 0,
            result=self._result,
            dropped_lines=self._dropped,
            missing_frames=missing,
            files=files,
            dropped_files=dropped_files,
        )
