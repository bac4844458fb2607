import json

import pytest
from sandpod_contract.runner import (
    MAX_FRAME_BYTES,
    LogReader,
    RunnerResult,
    Tail,
    parse_termination_message,
)

RESULT = {
    "exitCode": 1,
    "signal": None,
    "timedOut": False,
    "durationMs": 41,
    "stdoutBytes": 6,
    "stderrBytes": 10,
    "stdoutTruncated": False,
    "stderrTruncated": True,
    "peakMemoryBytes": 9437184,
    "diagnostics": None,
    "error": None,
}


def frames(*lines: dict[str, object]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


LOG = frames(
    {"stream": "stdout", "data": "hello\n"},
    {"stream": "stderr", "data": "Traceback\n"},
    {"stream": "stdout", "data": "wörld\n"},
    {"result": RESULT},
)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, len(LOG)])
def test_frames_split_anywhere(chunk: int) -> None:
    reader = LogReader(tail_bytes=1024)
    for start in range(0, len(LOG), chunk):
        reader.feed(LOG[start : start + chunk])
    summary = reader.finish()
    assert summary.stdout == "hello\nwörld\n"
    assert summary.stderr == "Traceback\n"
    assert not summary.stdout_clipped and not summary.stderr_clipped
    assert summary.result == RunnerResult.from_json(RESULT)
    assert summary.result is not None
    assert summary.result.exit_code == 1 and summary.result.stderr_truncated


def test_last_line_without_newline_counts() -> None:
    reader = LogReader(tail_bytes=1024)
    reader.feed(frames({"stream": "stdout", "data": "a"}) + json.dumps({"result": RESULT}).encode())
    assert reader.finish().result is not None


def test_tails_keep_the_end() -> None:
    reader = LogReader(tail_bytes=10)
    for i in range(100):
        reader.feed(frames({"stream": "stdout", "data": f"line {i}\n"}))
    summary = reader.finish()
    assert summary.stdout == "line 99\n"[-10:] or summary.stdout.endswith("line 99\n")
    assert len(summary.stdout.encode()) <= 10
    assert summary.stdout_clipped
    assert summary.result is None


def test_tail_never_splits_a_character() -> None:
    tail = Tail(limit=5)
    tail.add("€€€")  # 9 bytes; the last 5 start inside the second euro sign
    assert tail.text() == "€"
    assert tail.dropped


def test_tail_of_zero_keeps_nothing() -> None:
    tail = Tail(limit=0)
    tail.add("abc")
    assert tail.text() == "" and tail.dropped
    assert Tail(limit=0).text() == "" and not Tail(limit=0).dropped


def test_unframed_lines_become_stderr() -> None:
    reader = LogReader(tail_bytes=1024)
    reader.feed(b"panic: runtime error\n\n[1, 2]\n")
    summary = reader.finish()
    assert summary.stderr == "panic: runtime error\n[1, 2]\n"
    assert summary.result is None


def test_overlong_line_is_skipped() -> None:
    reader = LogReader(tail_bytes=1024)
    reader.feed(b"x" * (MAX_FRAME_BYTES + 1))
    reader.feed(b"yyy\n" + frames({"stream": "stdout", "data": "ok"}))
    summary = reader.finish()
    assert summary.stdout == "ok"
    assert summary.stderr == ""


def test_termination_message() -> None:
    parsed = parse_termination_message(json.dumps(RESULT))
    assert parsed is not None and parsed.duration_ms == 41
    assert parse_termination_message("") is None
    assert parse_termination_message("not json") is None
    assert parse_termination_message("[1]") is None


def test_result_parsing_is_tolerant() -> None:
    parsed = RunnerResult.from_json({"exitCode": True, "diagnostics": [{"code": "F401"}, 3]})
    assert parsed is not None
    assert parsed.exit_code is None
    assert parsed.diagnostics == [{"code": "F401"}]
    assert parsed.error is None
