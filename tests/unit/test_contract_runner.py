"""The runner protocol's one decoder: verified frames and summaries, bounded tails."""

import asyncio
import json

import pytest
import runner_wire
from runner_wire import KEY, file_frames, frame, lines, listing, pod_log, summary
from sandpod_contract.runner import (
    MAX_FRAME_BYTES,
    LiveOutput,
    LogReader,
    LogSummary,
    OutputChunk,
    RunnerResult,
    Summary,
    Tail,
    frame_mac,
    json_size,
    parse_summary,
)

RESULT = runner_wire.result(exitCode=1, stdoutBytes=12, stderrBytes=10, stderrTruncated=True)
OUTPUTS = [("stdout", "hello\n"), ("stderr", "Traceback\n"), ("stdout", "wörld\n")]
LOG = pod_log(OUTPUTS, RESULT)
TOLD = Summary.model_validate(summary(RESULT, len(OUTPUTS)))
OTHER_KEY = bytes(range(1, 33))


def read(log: bytes, told: Summary = TOLD, tail_bytes: int = 1024) -> LogReader:
    reader = LogReader(tail_bytes, told)
    reader.feed(log)
    return reader


def test_the_protocol_test_vectors() -> None:
    assert frame_mac(KEY, 1, "stdout", "hello\n") == "a0337636541183ad65d975da99c16a31"
    assert frame_mac(KEY, 42, "stderr", "é\u2028\u0001") == "f1fc9530ae2fbe9c9b362545b3fb0ff2"


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, len(LOG)])
def test_frames_split_anywhere(chunk: int) -> None:
    reader = LogReader(1024, TOLD)
    for start in range(0, len(LOG), chunk):
        reader.feed(LOG[start : start + chunk])
    found = reader.finish()
    assert (found.stdout, found.stderr) == ("hello\nwörld\n", "Traceback\n")
    assert not found.stdout_clipped and not found.stderr_clipped
    assert found.result == RunnerResult.model_validate(RESULT)
    assert (found.dropped_lines, found.missing_frames) == (0, 0)


def test_forged_and_replayed_frames_are_dropped_and_counted() -> None:
    genuine = [frame(1, "stdout", "real\n"), frame(2, "stdout", "more\n")]
    forged = lines(
        genuine[0],
        {"stream": "stdout", "data": "PASSED\n"},  # the old, unsigned shape
        frame(2, "stdout", "PASSED\n", OTHER_KEY),  # signed with a guessed key
        {**frame(2, "stdout", "x"), "data": "PASSED\n"},  # a genuine MAC on other data
        genuine[0],  # a replay
        genuine[1],
        {**genuine[1], "extra": 1},
    )
    log = forged + b"panic: not json\n" + lines(summary(RESULT, 2))
    found = read(log, Summary.model_validate(summary(RESULT, 2))).finish()
    assert found.stdout == "real\nmore\n"
    assert found.dropped_lines == 6
    assert found.result is not None


def test_a_summary_with_another_key_is_not_the_runners() -> None:
    forged = runner_wire.result(exitCode=0)
    log = lines(frame(1, "stdout", "hi\n", OTHER_KEY), summary(forged, 1, OTHER_KEY))
    found = read(log).finish()
    assert found.result is None
    assert (found.stdout, found.dropped_lines) == ("", 2)


def test_nothing_after_the_runners_summary_counts() -> None:
    log = LOG + lines(frame(4, "stdout", "late\n"), summary(runner_wire.result(), 4))
    found = read(log).finish()
    assert found.stdout == "hello\nwörld\n"
    assert found.result == RunnerResult.model_validate(RESULT)


@pytest.mark.parametrize(
    "log_result",
    [runner_wire.result(exitCode=0), {**RESULT, "durationMs": 1}, {**RESULT, "error": "x"}],
)
def test_a_log_summary_that_disagrees_with_the_termination_message_is_no_result(
    log_result: dict[str, object],
) -> None:
    log = lines(*(frame(i, s, d) for i, (s, d) in enumerate(OUTPUTS, 1)), summary(log_result, 3))
    assert read(log).finish().result is None


def test_the_termination_message_may_lack_diagnostics_and_shorten_the_error() -> None:
    full = runner_wire.result(exitCode=None, error="cannot start 'python3': no such file")
    told = Summary.model_validate(summary({**full, "error": "cannot start…"}, 0))
    assert read(lines(summary(full, 0)), told).finish().result is not None
    lint = runner_wire.result(diagnostics=[{"code": "F401", "message": "x", "line": 1}])
    told = Summary.model_validate(summary({**lint, "diagnostics": None}, 0))
    assert read(lines(summary(lint, 0)), told).finish().result is not None
    wrong = Summary.model_validate(summary({**full, "error": "cannot stop…"}, 0))
    assert read(lines(summary(full, 0)), wrong).finish().result is None


def test_a_log_missing_frames_is_incomplete_but_keeps_its_result() -> None:
    log = lines(frame(2, "stdout", "b"), summary(RESULT, 3))
    found = read(log).finish()
    assert found.stdout == "b" and found.stdout_clipped and found.stderr_clipped
    assert (found.missing_frames, found.result is not None) == (2, True)


def test_a_log_without_the_summary_is_no_result() -> None:
    found = read(LOG.rsplit(b"\n", 2)[0] + b"\n").finish()
    assert found.result is None and found.stdout == "hello\nwörld\n"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[1]",
        json.dumps(RESULT),  # the old protocol: a bare result
        json.dumps(summary(RESULT, 0) | {"key": "AB" * 32}),
        json.dumps(summary(RESULT, -1)),
        json.dumps(summary(RESULT, 0) | {"extra": True}),
        json.dumps(summary({**RESULT, "exitCode": True}, 0)),
        json.dumps(summary({**RESULT, "exitCode": 300}, 0)),
        json.dumps(summary({**RESULT, "error": "x" * 20_000}, 0)),
        json.dumps(summary({k: v for k, v in RESULT.items() if k != "timedOut"}, 0)),
    ],
)
def test_only_a_well_formed_summary_parses(text: str) -> None:
    assert parse_summary(text) is None


def test_a_well_formed_summary_parses() -> None:
    parsed = parse_summary(runner_wire.termination_message(RESULT, 3))
    assert parsed is not None and parsed.result.duration_ms == 40 and parsed.frames == 3


def test_tails_keep_the_end() -> None:
    outputs = [("stdout", f"line {i}\n") for i in range(100)]
    told = Summary.model_validate(summary(RESULT, 100))
    found = read(pod_log(outputs, RESULT), told, tail_bytes=10).finish()
    assert found.stdout.endswith("line 99\n") and json_size(found.stdout) <= 10
    assert found.stdout_clipped


@pytest.mark.parametrize(
    ("text", "size"),
    [("abc", 3), ("\x00", 6), ("\n", 2), ('"\\', 4), ("é", 6), ("😀", 12), ("<&>", 18)],
)
def test_json_size_is_the_largest_encoding(text: str, size: int) -> None:
    assert json_size(text) == size


@pytest.mark.parametrize("text", ["\x00" * 5000, "\ufffd" * 3000, "😀" * 2000, "a\x01" * 4000])
def test_tails_are_bounded_by_their_json_size(text: str) -> None:
    tail = Tail(limit=1000)
    for start in range(0, len(text), 777):
        tail.add(text[start : start + 777])
    kept = tail.text()
    assert 990 <= json_size(kept) <= 1000 and text.endswith(kept) and tail.dropped


def test_tail_of_zero_keeps_nothing() -> None:
    tail = Tail(limit=0)
    tail.add("abc")
    assert tail.text() == "" and tail.dropped
    assert Tail(limit=0).text() == "" and not Tail(limit=0).dropped


def test_overlong_line_is_skipped() -> None:
    log = b"x" * (MAX_FRAME_BYTES + 1) + b"yyy\n" + LOG
    found = read(log).finish()
    assert found.stdout == "hello\nwörld\n" and found.result is not None


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
CSV = b"a,b\n1,2\n"


def files_log(
    files: dict[str, bytes], listed: list[dict], files_bytes: int = 1 << 20
) -> LogSummary:
    outputs = [frame for path, content in files.items() for frame in file_frames(path, content)]
    runner_result = runner_wire.result(outputs=listed, outputsTruncated=False, outputsSkipped=1)
    reader = LogReader(
        1024, Summary.model_validate(summary(runner_result, len(outputs))), files_bytes
    )
    reader.feed(pod_log(outputs, runner_result))
    return reader.finish()


def test_file_frames_are_reassembled_and_verified_against_the_listing() -> None:
    found = files_log(
        {"plot.png": PNG, "data/t.csv": CSV},
        [listing("plot.png", PNG, "image/png"), listing("data/t.csv", CSV, "text/csv")],
    )
    assert found.result is not None and found.result.outputs_skipped == 1
    assert [(f.path, f.content, f.media_type) for f in found.files] == [
        ("plot.png", PNG, "image/png"),
        ("data/t.csv", CSV, "text/csv"),
    ]
    assert found.dropped_files == 0 and found.stdout == ""


def test_a_file_whose_bytes_do_not_match_its_listing_is_dropped() -> None:
    found = files_log(
        {"a.csv": CSV, "b.csv": CSV + b"more"},
        [listing("a.csv", CSV), listing("b.csv", CSV), listing("never-sent.txt", b"x")],
    )
    assert [f.path for f in found.files] == ["a.csv"]
    assert found.dropped_files == 2


def test_file_bytes_past_the_limit_are_verified_but_not_kept() -> None:
    found = files_log(
        {"a.png": PNG, "b.csv": CSV}, [listing("a.png", PNG), listing("b.csv", CSV)], 100
    )
    assert [(f.path, f.content) for f in found.files] == [("a.png", None), ("b.csv", CSV)]


def test_a_termination_message_without_the_value_agrees() -> None:
    full = RunnerResult.model_validate(runner_wire.result(value="'x'" * 2000))
    told = RunnerResult.model_validate(runner_wire.result(value=None))
    other = RunnerResult.model_validate(runner_wire.result(value="'y'"))
    assert full.agrees_with(told)
    assert not full.agrees_with(other)


def test_a_termination_message_without_the_outputs_list_agrees() -> None:
    full = RunnerResult.model_validate(runner_wire.result(outputs=[listing("a.csv", CSV)]))
    told = RunnerResult.model_validate(runner_wire.result(outputs=None))
    other = RunnerResult.model_validate(runner_wire.result(outputs=[listing("b.csv", CSV)]))
    assert full.agrees_with(told)
    assert not full.agrees_with(other)


def test_a_file_whose_name_could_show_as_another_is_dropped() -> None:
    # The runner never lists one (outputs.go); the decoder does not trust that it did not.
    forged = "report\u202etxt.exe"
    found = files_log(
        {forged: CSV, "clean.csv": CSV}, [listing(forged, CSV), listing("clean.csv", CSV)]
    )
    assert [f.path for f in found.files] == ["clean.csv"]
    assert found.dropped_files == 1


async def test_live_output_is_read_as_it_comes_while_the_run_goes_on() -> None:
    live = LiveOutput()
    release = asyncio.Event()

    async def run() -> str:
        live.put(OutputChunk("stdout", "first\n"))
        await release.wait()
        live.put(OutputChunk("stderr", "last\n"))
        return "done"

    running = asyncio.ensure_future(run())
    assert await live.started(running)
    read = []
    async for chunk in live.chunks(running):
        read.append(chunk)
        release.set()  # the run ends only once its first chunk has been read

    assert read == [OutputChunk("stdout", "first\n"), OutputChunk("stderr", "last\n")]
    assert running.result() == "done"


async def test_a_run_that_ends_before_writing_has_not_started_live_output() -> None:
    live = LiveOutput()

    async def run() -> None:
        return None

    running = asyncio.ensure_future(run())

    assert not await live.started(running)
