"""Judge0 CE 1.13.1's API: the translation (pure), and the official client (`judge0` from PyPI,
unchanged) over real HTTP against the gateway with its Kubernetes side faked. The fake plays the
operator: a program's fate is chosen by its source, its output is its stdin and arguments."""

import asyncio
import base64
import io
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import judge0
import pytest
from fastapi import FastAPI
from gateway_fakes import FakeExecutionService, Run, make_app, served, tenant
from sandpod_contract.names import QUEUED_LABEL
from sandpod_gateway.families.judge0 import judge0 as translation
from sandpod_gateway.families.judge0.judge0 import InvalidSubmission, Status, SubmissionRequest
from sandpod_gateway.families.judge0.router import BATCH_READS
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.schemas import ExecutionResult, ExecutionStatus, LanguageInfo
from sandpod_gateway.settings import GatewaySettings
from sandpod_testkit.waiting import wait_until

KEY = "sk-judge0-alice-0123456789"
OTHER_KEY = "sk-judge0-bob-0123456789"
RAN = {
    "startedAt": "2026-11-26T10:00:00Z",
    "finishedAt": "2026-11-26T10:00:01Z",
    "durationMs": 42,
    "peakMemoryBytes": 3_000_000,
}
# A program's fate, by a word in its source (the stand-in for the operator's verdicts).
FATES: dict[str, dict[str, Any]] = {
    "exit3": {
        "phase": "Failed",
        "reason": "NonZeroExit",
        "message": "exited 3",
        "exitCode": 3,
        "stderr": "no\n",
    },
    "segv": {"phase": "Failed", "reason": "Signaled", "signal": 11},
    "fpe": {"phase": "Failed", "reason": "Signaled", "signal": 8},
    "abort": {"phase": "Failed", "reason": "Signaled", "signal": 6},
    "kill": {"phase": "Failed", "reason": "Signaled", "signal": 9},
    "oom": {"phase": "Failed", "reason": "OOMKilled", "message": "out of memory"},
    "sleep": {"phase": "TimedOut", "reason": "DeadlineExceeded", "message": "too long"},
    "flood": {"phase": "Succeeded", "exitCode": 0, "stdout": "y\n" * 10, "stdoutTruncated": True},
    "broken": {
        "phase": "Failed",
        "reason": "CompilationError",
        "compileOutput": "main.go:1:1: expected 'package'\n",
    },
    "lost": {"phase": "Error", "reason": "NoResult", "message": "the runner is gone"},
}


def fated(spec: dict[str, Any]) -> Run:
    """What the fake operator reports: the fate the source names, else success, printing
    stdin and then the arguments."""
    source = spec["source"]
    for word, status in FATES.items():
        if word in source:
            return Run({**RAN, **status})
    stdout = (spec.get("stdin") or "") + " ".join(spec.get("args") or [])
    return Run({"phase": "Succeeded", "exitCode": 0, "stdout": stdout, **RAN})


class PromptOperator(FakeExecutionService):
    """Every execution has finished by the time anyone reads it (Judge0's clients poll)."""

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        if (namespace, name) in self.objects:
            self.finish(namespace, name)
        return await super().get(namespace, name)


CATALOG = LanguageCatalog(
    [
        LanguageInfo(name="python", version="3.11"),
        LanguageInfo(name="go", version="1.19", compiled=True),
        LanguageInfo(name="bash", version="5.2"),
    ]
)
CONFIG = translation.config_for(tenant("alice"), GatewaySettings())


def translate(**fields: Any) -> translation.Translated:
    body = SubmissionRequest(**{"source_code": "print(1)", "language_id": 71, **fields})
    return translation.translate(
        body, base64_encoded=False, config=CONFIG, catalog=CATALOG, max_code_bytes=256 * 1024
    )


def refusal(**fields: Any) -> dict[str, list[str]]:
    with pytest.raises(InvalidSubmission) as caught:
        translate(**fields)
    return caught.value.errors


def result(status: ExecutionStatus, **fields: Any) -> ExecutionResult:
    return ExecutionResult(id="t", status=status, language="python", **fields)


# --- the translation -----------------------------------------------------------------------


def test_a_submission_becomes_an_execution_request_with_judge0s_defaults() -> None:
    translated = translate(stdin="4\n", command_line_arguments="  a 'b c' $HOME;x ")
    request = translated.request
    assert (request.language, request.code, request.stdin) == ("python", "print(1)", "4\n")
    assert request.args == ["a", "b c", "HOMEx"]
    # The gateway's default timeout (10 s) is both CPU and wall limit; memory is the default.
    assert request.timeout_seconds == 10
    assert request.memory == "262144Ki"
    assert request.max_output_bytes == 1024 * 1024
    assert translated.record.language_id == 71


def test_judge0s_three_time_limits_become_one_wall_clock_limit() -> None:
    assert (
        translate(cpu_time_limit=2, cpu_extra_time=0.5, wall_time_limit=20).request.timeout_seconds
        == 3
    )
    assert translate(cpu_time_limit=5, wall_time_limit=4).request.timeout_seconds == 4
    # cpu_time_limit 0 is no CPU limit in isolate: the wall limit alone.
    assert translate(cpu_time_limit=0, wall_time_limit=7).request.timeout_seconds == 7
    assert translation.effective_timeout(0.2, 0, 1) == 1


def test_limits_beyond_the_tenants_and_options_sandpod_cannot_honour_are_refused() -> None:
    errors = refusal(
        wall_time_limit=61,
        memory_limit=10**9,
        stack_limit=1000,
        max_processes_and_or_threads=3,
        redirect_stderr_to_stdout=True,
        enable_network=True,
        callback_url="http://example.org/hook",
        compiler_options="-O2",
        number_of_runs=3,
        enable_per_process_and_thread_time_limit=True,
        max_file_size=10**6,
    )
    assert errors["wall_time_limit"] == ["must be less than or equal to 60"]
    assert errors["memory_limit"] == ["must be less than or equal to 524288"]
    assert errors["stack_limit"][0].startswith("must be equal to 8192")
    assert errors["redirect_stderr_to_stdout"] == ["this option cannot be enabled"]
    assert errors["enable_network"] == ["enabling network is not allowed"]
    assert errors["callback_url"] == ["setting callback is not allowed"]
    assert errors["compiler_options"] == ["setting compiler options is not allowed"]
    assert errors["number_of_runs"] == ["must be less than or equal to 1"]
    assert set(errors) >= {"max_processes_and_or_threads", "max_file_size"}
    # What the sandbox has anyway is accepted.
    assert translate(stack_limit=8192, redirect_stderr_to_stdout=False).request.code


def test_a_submission_without_source_or_with_an_unknown_language_is_refused_as_judge0_does() -> (
    None
):
    assert refusal(source_code="  ")["source_code"] == ["can't be blank"]
    assert refusal(language_id=62)["language_id"] == ["language with id 62 doesn't exist"]
    # TypeScript has a Judge0 id, but this catalog has no typescript.
    assert refusal(language_id=74)["language_id"] == ["language with id 74 doesn't exist"]
    assert refusal(command_line_arguments="'open")["command_line_arguments"]


def zipped(files: dict[str, bytes]) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return base64.b64encode(buffer.getvalue()).decode()


def test_additional_files_come_from_the_zip_and_bad_archives_are_refused() -> None:
    files = translate(additional_files=zipped({"data/in.txt": b"1 2\n", "lib.py": b"x = 1\n"}))
    assert {(f.path, base64.b64decode(f.content_base64 or "")) for f in files.request.files} == {
        ("data/in.txt", b"1 2\n"),
        ("lib.py", b"x = 1\n"),
    }
    assert refusal(additional_files="bm90IGEgemlw")["additional_files"] == [
        "is not a base64-encoded zip archive"
    ]
    assert (
        "cannot place"
        in refusal(additional_files=zipped({"../up.txt": b"x"}))["additional_files"][0]
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("big.txt", b"a" * 10_000)
    corrupt = bytearray(buffer.getvalue())
    corrupt[40:48] = b"\xff" * 8  # inside the compressed data
    errors = refusal(additional_files=base64.b64encode(bytes(corrupt)).decode())
    assert errors["additional_files"][0].startswith("cannot be extracted (big.txt")
    assert CONFIG.max_extract_size == 192  # KB: 3/4 of max_code_bytes, as base64 in the spec


def test_base64_fields_are_decoded_as_ruby_does_and_must_be_text() -> None:
    body = SubmissionRequest(
        source_code=base64.b64encode("print('é')".encode()).decode() + "\n",
        language_id=71,
        stdin=base64.b64encode(b"\xff\xfe").decode(),
    )
    with pytest.raises(InvalidSubmission) as caught:
        translation.translate(
            body, base64_encoded=True, config=CONFIG, catalog=CATALOG, max_code_bytes=1024
        )
    assert list(caught.value.errors) == ["stdin"]
    long = bytes(range(256))
    assert translation.ruby_decode64(translation.ruby_encode64(long)) == long
    assert all(len(line) <= 60 for line in translation.ruby_encode64(long).splitlines())
    assert translation.ruby_encode64(b"hello, Judge0\n") == "aGVsbG8sIEp1ZGdlMAo=\n"


@pytest.mark.parametrize(
    ("expected", "stdout", "accepted"),
    [
        ("4", "4\n", True),
        ("a  \nb\n\n", "a\nb", True),
        ("a\nb", "a\n b", False),
        ("", "", False),  # Judge0: no output is nil, and nil is not ""
        (None, "anything", True),
    ],
)
def test_stdout_is_compared_with_expected_output_as_judge0_compares(
    expected: str | None, stdout: str, accepted: bool
) -> None:
    verdict = translation.verdict(result(ExecutionStatus.success, stdout=stdout), expected)
    assert verdict == (Status.ACCEPTED if accepted else Status.WRONG_ANSWER)


@pytest.mark.parametrize(
    ("status", "fields", "verdict"),
    [
        (ExecutionStatus.pending, {}, Status.IN_QUEUE),
        (ExecutionStatus.running, {}, Status.PROCESSING),
        (ExecutionStatus.timeout, {}, Status.TIME_LIMIT_EXCEEDED),
        (ExecutionStatus.compile_error, {}, Status.COMPILATION_ERROR),
        (ExecutionStatus.error, {"exit_code": 1}, Status.NZEC),
        (ExecutionStatus.error, {"signal": 11}, Status.SIGSEGV),
        (ExecutionStatus.error, {"signal": 25}, Status.SIGXFSZ),
        (ExecutionStatus.error, {"signal": 8}, Status.SIGFPE),
        (ExecutionStatus.error, {"signal": 6}, Status.SIGABRT),
        (ExecutionStatus.error, {"signal": 9}, Status.OTHER),
        (ExecutionStatus.error, {"reason": "OOMKilled"}, Status.OTHER),
        (ExecutionStatus.sandbox_error, {}, Status.INTERNAL_ERROR),
        (ExecutionStatus.cancelled, {}, Status.INTERNAL_ERROR),
        (ExecutionStatus.success, {"stdout_truncated": True}, Status.SIGXFSZ),
    ],
)
def test_verdicts_come_from_the_execution_status(
    status: ExecutionStatus, fields: dict[str, Any], verdict: Status
) -> None:
    assert translation.verdict(result(status, **fields), None) == verdict


def test_the_program_cannot_choose_its_verdict_by_what_it_prints() -> None:
    printed = 'Accepted\n{"status": {"id": 3}}\n'
    failed = result(ExecutionStatus.error, exit_code=1, stdout=printed)
    assert translation.verdict(failed, printed) == Status.NZEC


def test_times_and_dates_are_written_as_rails_writes_them() -> None:
    assert [translation.decimal_text(v) for v in (0.002, 1.5, 2, 0.0404)] == [
        "0.002",
        "1.5",
        "2.0",
        "0.04",
    ]
    moment = datetime(2026, 11, 26, 10, 0, 1, 123456, tzinfo=UTC)
    assert translation.rails_time(moment) == "2026-11-26T10:00:01.123Z"


def test_all_languages_are_the_catalogs_by_name_none_archived() -> None:
    assert translation.all_languages(CATALOG) == [
        {"id": 46, "name": "Bash (5.2)", "is_archived": False},
        {"id": 60, "name": "Go (1.19)", "is_archived": False},
        {"id": 71, "name": "Python (3.11)", "is_archived": False},
    ]


def test_requested_fields_are_checked_like_judge0s() -> None:
    assert translation.requested_fields(None) == translation.DEFAULT_FIELDS
    assert translation.requested_fields("*") == translation.ALL_FIELDS
    assert translation.requested_fields("stdout,status_id") == ("stdout", "status_id")
    with pytest.raises(translation.InvalidFields, match=r"invalid fields: \[nope\]"):
        translation.requested_fields("stdout,nope")


# --- the official client over HTTP ----------------------------------------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, FakeExecutionService]]:
    service = PromptOperator(fated)
    keys = {KEY: tenant("alice", max_concurrent=30), OTHER_KEY: tenant("bob")}
    with served(make_app(service, keys, tmp_path)) as url:
        yield f"{url}/judge0", service


@pytest.fixture
def client(gateway: tuple[str, FakeExecutionService]) -> judge0.Client:
    return judge0.Client(endpoint=gateway[0], headers={"X-Auth-Token": KEY})


def test_the_official_client_starts_against_the_gateway(client: judge0.Client) -> None:
    # Its constructor reads /languages and /config_info into its own models.
    assert {language.id for language in client.languages} >= {71, 63, 74, 46, 51, 60}
    assert client.config.max_wall_time_limit == 60
    assert client.version == "1.13.1"
    assert client.get_language(71).name.startswith("Python (")
    assert [s["id"] for s in client.get_statuses()] == list(range(1, 15))


def test_version_is_judge0s_as_text(gateway: tuple[str, FakeExecutionService]) -> None:
    answer = httpx.get(f"{gateway[0]}/version", headers={"X-Auth-Token": KEY})
    assert (answer.status_code, answer.text) == (200, "1.13.1")
    assert answer.headers["content-type"].startswith("text/plain")
    assert httpx.get(f"{gateway[0]}/version").status_code == 401


def test_authenticate_is_200_for_a_known_key_only(
    gateway: tuple[str, FakeExecutionService],
) -> None:
    url = f"{gateway[0]}/authenticate"
    for headers in ({"X-Auth-Token": KEY}, {"Authorization": f"Bearer {OTHER_KEY}"}):
        answer = httpx.post(url, headers=headers)
        assert (answer.status_code, answer.content) == (200, b"")
    assert httpx.post(url).status_code == 401
    refused = httpx.post(url, headers={"X-Auth-Token": "sk-nope"})
    assert (refused.status_code, refused.json()) == (401, {"error": "Invalid API key"})


def test_authorize_is_403_for_every_key_as_judge0_without_authorization_tokens(
    gateway: tuple[str, FakeExecutionService],
) -> None:
    """Judge0's X-Auth-User authorizes listing and deleting submissions, which sandpod does
    not serve; authentication still comes first (401)."""
    url = f"{gateway[0]}/authorize"
    forbidden = httpx.post(url, headers={"X-Auth-Token": KEY, "X-Auth-User": KEY})
    assert forbidden.status_code == 403
    assert forbidden.json()["error"].startswith("authorization is disabled")
    assert httpx.post(url, headers={"X-Auth-User": KEY}).status_code == 401


def test_all_languages_are_listed_with_is_archived(
    client: judge0.Client, gateway: tuple[str, FakeExecutionService]
) -> None:
    answer = httpx.get(f"{gateway[0]}/languages/all", headers={"X-Auth-Token": KEY})
    assert answer.status_code == 200, answer.text
    listed = answer.json()
    assert all(set(entry) == {"id", "name", "is_archived"} for entry in listed)
    assert not any(entry["is_archived"] for entry in listed)
    # The languages of /languages, in the same order.
    assert [entry["id"] for entry in listed] == [language.id for language in client.languages]
    assert {entry["id"] for entry in listed} >= {71, 63, 74, 46, 51, 60}
    assert httpx.get(f"{gateway[0]}/languages/all").status_code == 401


def test_a_run_with_test_cases_gets_judge0s_verdicts(client: judge0.Client) -> None:
    submissions = judge0.run(
        client=client,
        source_code="print(input())",
        language=judge0.PYTHON,
        test_cases=[("4\n", "4"), ("5\n", "6"), judge0.TestCase("é\n", "é")],
    )
    assert [s.status for s in submissions] == [
        judge0.Status.ACCEPTED,
        judge0.Status.WRONG_ANSWER,
        judge0.Status.ACCEPTED,
    ]
    first = submissions[0]
    assert (first.stdout, first.time, first.wall_time, first.exit_code) == ("4\n", 0.042, 0.042, 0)
    assert first.memory == 2930  # KB, from the runner's peak resident memory


def test_each_runtime_verdict_with_its_exit_code_and_signal(client: judge0.Client) -> None:
    # (The client's Submission base64-decodes a source_code that happens to be base64: "()"
    # keeps these from being.)
    sources = [f"{word}()" for word in FATES if word != "broken"]
    submissions = judge0.run(
        client=client,
        submissions=[judge0.Submission(source_code=s, language=judge0.PYTHON) for s in sources],
    )
    seen = {str(s.source_code)[:-2]: (s.status, s.exit_code, s.exit_signal) for s in submissions}
    assert seen == {
        "exit3": (judge0.Status.RUNTIME_ERROR_NZEC, 3, None),
        "segv": (judge0.Status.RUNTIME_ERROR_SIGSEGV, 0, 11),
        "fpe": (judge0.Status.RUNTIME_ERROR_SIGFPE, 0, 8),
        "abort": (judge0.Status.RUNTIME_ERROR_SIGABRT, 0, 6),
        "kill": (judge0.Status.RUNTIME_ERROR_OTHER, 0, 9),
        "oom": (judge0.Status.RUNTIME_ERROR_OTHER, 0, None),
        "sleep": (judge0.Status.TIME_LIMIT_EXCEEDED, 0, None),
        "flood": (judge0.Status.RUNTIME_ERROR_SIGXFSZ, 0, None),
        "lost": (judge0.Status.INTERNAL_ERROR, None, None),
    }


def test_a_compilation_error_carries_compile_output(client: judge0.Client) -> None:
    submission = judge0.run(client=client, source_code="broken", language=judge0.GO)
    assert submission.status == judge0.Status.COMPILATION_ERROR
    assert submission.compile_output == "main.go:1:1: expected 'package'\n"
    assert (submission.stdout, submission.time, submission.memory) == (None, None, None)


def test_arguments_and_stdin_reach_the_program(client: judge0.Client) -> None:
    submission = judge0.run(
        client=client,
        source_code="echo $@",
        language=judge0.BASH,
        stdin="in:",
        command_line_arguments="a 'b c'",
    )
    assert submission.stdout == "in:a b c"


def test_additional_files_from_the_clients_filesystem_become_the_executions_files(
    client: judge0.Client, gateway: tuple[str, FakeExecutionService]
) -> None:
    files = judge0.Filesystem(content=[judge0.File(name="data/in.txt", content="1 2\n")])
    submission = judge0.run(
        client=client, source_code="print(1)", language=judge0.PYTHON, additional_files=files
    )
    assert submission.status == judge0.Status.ACCEPTED
    spec = gateway[1].objects[("ns-alice", str(submission.token))]["spec"]
    assert spec["files"] == [{"path": "data/in.txt", "content": "MSAyCg==", "encoding": "base64"}]


def test_a_batch_larger_than_judge0s_batch_size_is_split_by_the_client(
    client: judge0.Client, gateway: tuple[str, FakeExecutionService]
) -> None:
    submissions = judge0.run(
        client=client,
        submissions=[
            judge0.Submission(source_code="print(input())", language=judge0.PYTHON, stdin=f"{i}")
            for i in range(25)
        ],
    )
    assert [s.stdout for s in submissions] == [str(i) for i in range(25)]
    # Each submission is one execution, named by its token.
    tokens = {str(s.token) for s in submissions}
    assert tokens <= {name for _, name in gateway[1].objects}


def test_wait_true_answers_with_the_result(gateway: tuple[str, FakeExecutionService]) -> None:
    response = httpx.post(
        f"{gateway[0]}/submissions",
        params={"wait": "true", "fields": "stdout,status_id,language,created_at"},
        json={"source_code": "x", "language_id": 71, "stdin": "hi", "expected_output": "hi"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["stdout"] == "hi"
    assert body["status_id"] == 3
    assert body["language"] == {"id": 71, "name": "Python (3.11)"}
    assert body["created_at"].endswith("Z")


def test_judge0_errors_have_judge0s_shapes(gateway: tuple[str, FakeExecutionService]) -> None:
    url, headers = gateway[0], {"X-Auth-Token": KEY}
    refused = httpx.post(f"{url}/submissions", json={"source_code": "x"}, headers=headers)
    assert (refused.status_code, refused.json()) == (422, {"language_id": ["can't be blank"]})
    fields = httpx.get(f"{url}/submissions/x", params={"fields": "nope"}, headers=headers)
    assert (fields.status_code, fields.json()) == (400, {"error": "invalid fields: [nope]"})
    batch = httpx.post(
        f"{url}/submissions/batch",
        json={"submissions": [{"source_code": "x", "language_id": 71}, {"language_id": 999}]},
        headers=headers,
    )
    assert batch.status_code == 201
    assert "token" in batch.json()[0]
    assert batch.json()[1] == {
        "source_code": ["can't be blank"],
        "language_id": ["language with id 999 doesn't exist"],
    }
    empty = httpx.post(f"{url}/submissions/batch", json={"submissions": []}, headers=headers)
    assert empty.status_code == 400
    assert httpx.get(f"{url}/about").status_code == 401
    assert httpx.get(f"{url}/about", headers={"X-Auth-Token": "nope"}).status_code == 401


def test_another_tenants_token_is_not_found(
    client: judge0.Client, gateway: tuple[str, FakeExecutionService]
) -> None:
    mine = judge0.async_run(client=client, source_code="x", language=judge0.PYTHON)
    bob = judge0.Client(endpoint=gateway[0], headers={"X-Auth-Token": OTHER_KEY})
    with pytest.raises(httpx.HTTPStatusError) as caught:
        bob.get_submission(mine)
    assert caught.value.response.status_code == 404
    batch = httpx.get(
        f"{gateway[0]}/submissions/batch",
        params={"tokens": str(mine.token)},
        headers={"X-Auth-Token": OTHER_KEY},
    )
    assert batch.json() == {"submissions": [None]}


class SlowReads(FakeExecutionService):
    """Reads that take a while, counting how many are in flight at most."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most_in_flight = 0

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            return await super().get(namespace, name)
        finally:
            self.in_flight -= 1


def test_a_batch_is_read_a_bounded_number_at_a_time(tmp_path: Path) -> None:
    service = SlowReads()
    with served(make_app(service, {KEY: tenant("alice")}, tmp_path)) as url:
        tokens = ",".join(f"missing-{n}" for n in range(100))
        batch = httpx.get(
            f"{url}/judge0/submissions/batch",
            params={"tokens": tokens},
            headers={"X-Auth-Token": KEY},
        )
    assert batch.json() == {"submissions": [None] * 100}
    assert 1 < service.most_in_flight <= BATCH_READS


def test_base64_answers_are_encoded_as_judge0_encodes_them(
    gateway: tuple[str, FakeExecutionService],
) -> None:
    url, headers = gateway[0], {"X-Auth-Token": KEY}
    source = base64.b64encode(b"x").decode()
    created = httpx.post(
        f"{url}/submissions",
        params={"base64_encoded": "true", "wait": "true", "fields": "*"},
        json={
            "source_code": source,
            "language_id": 71,
            "stdin": base64.b64encode(b"\xc3\xa9\n").decode(),
        },
        headers=headers,
    ).json()
    assert created["stdout"] == "w6kK\n"
    assert created["source_code"] == "eA==\n"
    assert created["status"] == {"id": 3, "description": "Accepted"}


def test_submissions_beyond_the_tenants_concurrency_wait_in_its_queue(tmp_path: Path) -> None:
    """Beyond the tenant's maxConcurrent a submission is created queued (the operator starts
    it in turn) and reads In Queue; beyond the queue's size too, 503 "queue is full", with
    Retry-After. A batch fits as a whole, or none of it is created."""
    service = FakeExecutionService(runner=None)
    keys = {KEY: tenant("alice", max_concurrent=2)}
    with served(make_app(service, keys, tmp_path, judge0_queue_size=2)) as url:
        headers = {"X-Auth-Token": KEY}
        submission = {"source_code": "x", "language_id": 71}
        first = httpx.post(f"{url}/judge0/submissions", json=submission, headers=headers)
        assert first.status_code == 201
        too_many = httpx.post(
            f"{url}/judge0/submissions/batch",
            json={"submissions": [submission] * 4},
            headers=headers,
        )
        assert too_many.status_code == 503
        assert too_many.json()["error"] == (
            "queue is full (1 executions are already running or waiting and 4 more were "
            "asked for; this tenant may run 2 at once and 2 may wait.)"
        )
        assert len(service.created) == 1
        batch = httpx.post(
            f"{url}/judge0/submissions/batch",
            json={"submissions": [submission] * 3},
            headers=headers,
        ).json()
        queued = [
            (resource["metadata"].get("labels") or {}).get(QUEUED_LABEL)
            for resource in service.created
        ]
        # A submission alone waits only beyond maxConcurrent; a batch's all wait queued at
        # once, the operator's queue letting them go in turn.
        assert queued == [None, "2", "2", "2"]
        waiting = httpx.get(f"{url}/judge0/submissions/{batch[2]['token']}", headers=headers)
        assert waiting.json()["status"] == {"id": 1, "description": "In Queue"}
        full = httpx.post(f"{url}/judge0/submissions", json=submission, headers=headers)
    assert full.status_code == 503
    assert full.json()["error"].startswith("queue is full (4 executions are already running")
    assert int(full.headers["Retry-After"]) >= 1


def test_a_callback_puts_the_result_to_a_host_the_platform_allows(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    hook = FastAPI()
    hook.get("/healthz")(lambda: {})

    @hook.put("/done")
    async def done(body: dict[str, Any]) -> None:
        received.append(body)

    with served(hook) as hook_url:
        allowed = urlsplit(hook_url).netloc
        app = make_app(
            PromptOperator(fated), {KEY: tenant("alice")}, tmp_path, judge0_callback_hosts=[allowed]
        )
        with served(app) as url:
            client = judge0.Client(endpoint=f"{url}/judge0", headers={"X-Auth-Token": KEY})
            assert client.config.enable_callbacks
            refused = httpx.post(
                f"{url}/judge0/submissions",
                json={"source_code": "x", "language_id": 71, "callback_url": "http://lms.test/"},
                headers={"X-Auth-Token": KEY},
            )
            assert refused.json() == {
                "callback_url": ["host lms.test:80 is not allowed for callbacks"]
            }
            submission = judge0.async_run(
                client=client,
                source_code="print(input())",
                language=judge0.PYTHON,
                stdin="hi",
                callback_url=f"{hook_url}/done",
            )
            wait_until(lambda: received, timeout=30, what="the callback")
    body = received[0]
    assert set(body) == set(translation.DEFAULT_FIELDS)
    assert body["token"] == str(submission.token)
    assert body["status"] == {"id": 3, "description": "Accepted"}
    assert base64.b64decode(body["stdout"]) == b"hi"


def test_the_message_is_the_platforms_never_the_programs(
    gateway: tuple[str, FakeExecutionService],
) -> None:
    """Judge0's message is the status's message: what the platform said (the REST
    error_message may quote a Python traceback, the program's words)."""
    created = httpx.post(
        f"{gateway[0]}/submissions",
        params={"wait": "true", "fields": "message,status_id,stderr"},
        json={"source_code": "exit3()", "language_id": 71},
        headers={"X-Auth-Token": KEY},
    ).json()
    assert created == {"message": "exited 3", "status_id": 11, "stderr": "no\n"}
