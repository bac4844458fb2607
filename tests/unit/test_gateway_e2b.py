"""E2B's API and data plane: the translation (pure), and the official SDKs (`e2b`,
`e2b-code-interpreter` from PyPI, unchanged) over real HTTP against the gateway with its
Kubernetes side faked. The fake plays the session's kernel: a cell's fate is chosen by its
source. The cluster suite (tests/e2e/test_e2b.py) runs the same SDKs against real sessions."""

import base64
import contextlib
import gzip
import io
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import e2b
import httpx
import pytest
from e2b.sandbox.filesystem.filesystem import WriteEntry
from e2b_code_interpreter import Sandbox
from fake_clock import FakeClock
from gateway_fakes import FakeExecutionService, FakeSessionService, Run, make_app, served, tenant
from python_kernel import PythonKernel
from sandpod_contract.models import MAX_FILE_CHARS
from sandpod_contract.names import RECORD_DIRECT, RECORD_LABEL
from sandpod_gateway.families.e2b import programs, protocol
from sandpod_gateway.families.e2b.protocol import E2bError
from sandpod_gateway.families.e2b.router import is_direct_record
from sandpod_gateway.policy.admission import AdmissionControl
from sandpod_gateway.schemas import ExecutionResult, ExecutionStatus, FileOutput

KEY = "sk-e2b-alice-0123456789"
OTHER_KEY = "sk-e2b-bob-0123456789"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "<cell>", line 1, in <module>\n'
    "ZeroDivisionError: division by zero\n"
)


class Kernel:
    """The fake session's kernel: the code interpreter's calls run in the runner's own python
    kernel (a real interpreter, the session module really installed and called); the E2B
    family's other programs (files, commands) and file transfers really run, in a directory
    standing for the work directory."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.lock = threading.Lock()
        self.python = PythonKernel(work)
        self.module_runs = 0

    def __call__(self, spec: dict[str, Any]) -> Run:
        source = spec["source"]
        if programs.SESSION_MODULE_NAME in source:
            self.module_runs += 1
            return self.in_kernel(source)
        if "subprocess.run" in source:  # a command: its output goes to the run's own streams
            return self.in_kernel(source)
        if source.startswith("(lambda") or spec.get("files"):
            return self.really(spec)
        return Run({"phase": "Succeeded", "exitCode": 0, "stdout": "hi\n", "result": "42"})

    def in_kernel(self, source: str) -> Run:
        module = programs.SESSION_MODULE
        moved = module.replace(repr(programs.WORK_DIR), repr(str(self.work)))
        source = source.replace(repr(module), repr(moved))
        source = source.replace(f"'{programs.WORK_DIR}", f"'{self.work}")
        with self.lock:
            run = self.python.run(source)
        phase = "Succeeded" if run.exit_code == 0 else "Failed"
        return Run(
            {
                "phase": phase,
                "exitCode": run.exit_code,
                "stdout": run.stdout,
                "stderr": run.stderr,
                "result": run.value,
            }
        )

    def really(self, spec: dict[str, Any]) -> Run:
        for file in spec.get("files") or []:
            target = self.work / file["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            if file.get("encoding") == "base64":
                target.write_bytes(base64.b64decode(file["content"]))
            else:
                target.write_text(file["content"])
        source = spec["source"].replace(repr(programs.WORK_DIR), repr(str(self.work)))
        out, err = io.StringIO(), io.StringIO()
        with (
            self.lock,
            contextlib.chdir(self.work),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                value = eval(source) if source.startswith("(lambda") else None
                code = 0
            except SystemExit as exc:
                value, code = None, int(exc.code or 0)
        status = {"phase": "Succeeded" if code == 0 else "Failed", "exitCode": code}
        return Run(
            {
                **status,
                "stdout": out.getvalue(),
                "stderr": err.getvalue(),
                "result": None if value is None else repr(value),
            }
        )


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    work = tmp_path / "work"
    work.mkdir()
    found = Kernel(work)
    yield found
    found.python.close()


@pytest.fixture
def sessions() -> FakeSessionService:
    return FakeSessionService()


def e2b_app(
    tmp_path: Path,
    kernel: Kernel,
    sessions: FakeSessionService,
    limits: dict[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """The gateway with the direct path's secret (E2B's tokens need it); `limits`: alice's."""
    token = tmp_path / "direct-token"
    token.write_text("a-shared-secret\n")
    keys = {KEY: tenant("alice", **(limits or {})), OTHER_KEY: tenant("bob")}
    service = FakeExecutionService(kernel)
    return make_app(service, keys, tmp_path, sessions, direct_token_file=str(token), **settings)


@pytest.fixture
def gateway(tmp_path: Path, kernel: Kernel, sessions: FakeSessionService) -> Iterator[str]:
    with served(e2b_app(tmp_path, kernel, sessions)) as url:
        yield url


@pytest.fixture
def e2b_env(gateway: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("E2B_API_URL", f"{gateway}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", KEY)
    return gateway


def test_the_sdk_creates_lists_times_out_connects_and_kills(e2b_env: str) -> None:
    sandbox = Sandbox.create(metadata={"user": "ada"}, timeout=120)
    other = Sandbox.create(template="base", metadata={"user": "bob"})
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "code-interpreter-v1"
    assert info.metadata == {"user": "ada"}
    listed = Sandbox.list(query=e2b.SandboxQuery(metadata={"user": "ada"})).next_items()
    assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
    paginator = Sandbox.list(limit=1)
    pages = [paginator.next_items()]
    while paginator.has_next:
        pages.append(paginator.next_items())
    assert sorted(s.sandbox_id for page in pages for s in page) == sorted(
        [sandbox.sandbox_id, other.sandbox_id]
    )
    assert [len(page) for page in pages] == [1, 1]
    sandbox.set_timeout(600)
    assert sandbox.get_info().end_at > info.end_at
    connected = Sandbox.connect(sandbox.sandbox_id)
    assert connected.is_running()
    assert connected.run_code("6 * 7").text == "42"
    sandbox.kill()
    assert other.is_running() and not sandbox.is_running()
    assert Sandbox.list(query=e2b.SandboxQuery(metadata={"user": "ada"})).next_items() == []
    with pytest.raises(e2b.NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


def test_the_list_is_newest_first_and_filtered_by_start_and_template(e2b_env: str) -> None:
    older = Sandbox.create(metadata={"suite": "order"})
    newer = Sandbox.create(template="base", metadata={"suite": "order"})
    query = e2b.SandboxQuery(metadata={"suite": "order"})

    def listed(**options: Any) -> list[str]:
        found = Sandbox.list(**options).next_items()
        return [s.sandbox_id for s in found]

    ids = [older.sandbox_id, newer.sandbox_id]
    assert listed(query=query) == ids[::-1]
    assert listed(query=query, order="asc") == ids
    started = newer.get_info().started_at
    since = e2b.SandboxQuery(metadata={"suite": "order"}, started_after=started)
    assert listed(query=since) == [newer.sandbox_id]
    later = e2b.SandboxQuery(started_after=started + timedelta(seconds=1))
    assert listed(query=later) == []
    assert listed(query=e2b.SandboxQuery(template="base")) == [newer.sandbox_id]
    assert listed(query=e2b.SandboxQuery(template="unknown-template")) == []


def test_a_cell_is_one_run_once_the_session_has_the_module(e2b_env: str, kernel: Kernel) -> None:
    sandbox = Sandbox.create(envs={"WHO": "sandbox"})
    seen: list[str] = []
    first = sandbox.run_code("print('hi')\nx = 41\nx + 1", on_stdout=lambda m: seen.append(m.line))
    assert (first.logs.stdout, seen, first.text, first.error) == (["hi\n"], ["hi\n"], "42", None)
    assert first.execution_count == 1
    assert kernel.module_runs == 1  # the first call carries the module: one run
    envs = sandbox.run_code("import os\n(os.environ['WHO'], os.environ.get('A'))", envs={"A": "b"})
    assert envs.text == "('sandbox', 'b')"
    assert (
        sandbox.run_code("os.environ.get('A'), os.environ.get('WHO')").text == "(None, 'sandbox')"
    )
    assert sandbox.run_code("x;").text is None
    assert kernel.module_runs == 4
    failed = sandbox.run_code("print('warn', file=__import__('sys').stderr)\n1/0")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
    assert (
        failed.error.traceback.splitlines()[1] == '  File "<cell default:5>", line 2, in <module>'
    )
    assert (failed.logs.stderr, failed.execution_count) == (["warn\n"], 5)
    # An interpreter that lost the module (restarted) says so; the call is sent again with it.
    kernel.python.close()
    kernel.python = PythonKernel(kernel.work)
    assert sandbox.run_code("1 + 1").text == "2"
    assert kernel.module_runs == 7


def test_a_cell_with_a_common_indent_runs_dedented(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    cell = sandbox.run_code("\n    x = 2\n    if x:\n        x *= 3\n    x\n")
    assert (cell.error, cell.text) == (None, "6")
    traceback = sandbox.run_code("  1 / 0").error
    assert traceback is not None and traceback.name == "ZeroDivisionError"


def test_only_a_python_cell_with_a_margin_is_dedented() -> None:
    assert protocol.cell_code("  a = 1\n  b = 2\n", None) == "a = 1\nb = 2\n"
    assert protocol.cell_code("\n\tif a:\n\t\tb\n", "python") == "\nif a:\n\tb\n"
    kept = 's = """\n   \n"""\n'
    assert protocol.cell_code(kept, "python") == kept
    assert protocol.cell_code("  x", "javascript") == "  x"


def test_a_str_result_shows_as_its_value(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    assert sandbox.run_code("'bar'").text == "bar"
    assert sandbox.run_code("import os\nos.environ.get('FOO')", envs={"FOO": "foo"}).text == "foo"
    assert sandbox.run_code('"it\'s"').text == '"it\'s"'
    assert sandbox.run_code("['a']").text == "['a']"


def test_plain_text_drops_one_pair_of_enclosing_single_quotes() -> None:
    assert protocol.plain_text("'bar'") == "bar"
    assert protocol.plain_text("'a\\nb'") == "a\\nb"
    assert protocol.plain_text('"it\'s"') == '"it\'s"'
    assert [protocol.plain_text(t) for t in ("'", "''", "42", "('a', 'b')")] == [
        "'",
        "",
        "42",
        "('a', 'b')",
    ]


def test_contexts_have_their_own_namespace_directory_and_count(
    e2b_env: str, kernel: Kernel
) -> None:
    sandbox = Sandbox.create()
    sandbox.run_code("x = 'default'")
    (kernel.work / "sub").mkdir()
    other = sandbox.create_code_context(cwd="/home/user/sub")
    assert (other.language, other.cwd) == ("python", "/home/user/sub")
    assert {c.id for c in sandbox.list_code_contexts()} == {"default", other.id}
    there = sandbox.run_code("x = 'other'\nimport os\nos.getcwd()", context=other)
    assert (there.text, there.execution_count) == (str(kernel.work / "sub"), 1)
    assert sandbox.run_code("x").text == "default"
    sandbox.restart_code_context(other)
    assert sandbox.run_code("x", context=other).error is not None
    with pytest.raises(e2b.SandboxException, match=r"400.*cannot be removed"):
        sandbox.remove_code_context("default")
    with pytest.raises(e2b.SandboxException, match=r"400.*this sandbox runs python"):
        sandbox.create_code_context(language="js")
    sandbox.remove_code_context(other)
    with pytest.raises(e2b.NotFoundException):
        sandbox.run_code("1", context=other)
    with pytest.raises(e2b.NotFoundException):
        sandbox.restart_code_context(other)


def test_rich_results_and_display(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    execution = sandbox.run_code(
        "class Page:\n"
        "    def _repr_html_(self): return '<b>hi</b>'\n"
        "    def _repr_json_(self): return {'a': 1}\n"
        "    def _repr_png_(self): return b'png'\n"
        "    def __repr__(self): return 'Page'\n"
        "display(Page(), 'two')\n"
        "Page()"
    )
    assert [(r.text, r.is_main_result) for r in execution.results] == [
        ("Page", False),
        ("two", False),
        ("Page", True),
    ]
    page = execution.results[0]
    assert (page.html, page.json, page.png) == ("<b>hi</b>", {"a": 1}, "cG5n")
    big = sandbox.run_code("class Big:\n    def _repr_html_(self): return 'x' * 100_000\nBig()")
    assert big.results[0].html is None and big.results[0].text.startswith("<")
    assert any(line.startswith("sandpod: result 1: its html") for line in big.logs.stderr)
    many = sandbox.run_code("for i in range(200): display(i)")
    assert len(many.results) == protocol.MAX_DISPLAYS
    assert "72 more dropped" in "".join(many.logs.stderr)


def test_files_and_commands_go_through_envd_calls(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    info = sandbox.files.write("/home/user/data/a.txt", "alpha")
    assert info.path == "/home/user/data/a.txt"
    sandbox.files.write("b.bin", b"\x00\xff")
    assert sandbox.files.read("/home/user/data/a.txt") == "alpha"
    assert sandbox.files.read("b.bin", format="bytes") == b"\x00\xff"
    assert sandbox.files.exists("/home/user/data/a.txt")
    assert not sandbox.files.exists("/home/user/nope")
    assert {e.name for e in sandbox.files.list("/home/user")} >= {"data", "b.bin"}
    assert sandbox.files.make_dir("/home/user/new")
    assert not sandbox.files.make_dir("/home/user/new")
    moved = sandbox.files.rename("/home/user/data/a.txt", "/home/user/new/a.txt")
    assert moved.path == "/home/user/new/a.txt"
    sandbox.files.remove("/home/user/new")
    assert not sandbox.files.exists("/home/user/new/a.txt")
    seen: list[str] = []
    done = sandbox.commands.run(
        "echo $GREETING; echo oops >&2", envs={"GREETING": "hello"}, on_stdout=seen.append
    )
    assert (done.stdout, done.stderr, done.exit_code) == ("hello\n", "oops\n", 0)
    assert seen == ["hello\n"]
    with pytest.raises(e2b.CommandExitException) as failed:
        sandbox.commands.run("exit 3")
    assert failed.value.exit_code == 3
    handle = sandbox.commands.run("echo later", background=True)
    assert handle.wait().stdout == "later\n"


def test_removing_a_missing_path_does_nothing_and_a_symlink_is_followed(
    e2b_env: str, kernel: Kernel
) -> None:
    sandbox = Sandbox.create()
    sandbox.files.remove("/home/user/never-there.txt")
    sandbox.files.remove("/home/user/no-dir/never-there.txt")
    sandbox.files.write("/home/user/dir/target.txt", "hello")
    (kernel.work / "dir" / "link.txt").symlink_to("target.txt")
    (kernel.work / "to-dir").symlink_to("dir")
    (kernel.work / "dangling").symlink_to("nowhere")
    info = sandbox.files.get_info("/home/user/dir/link.txt")
    assert (info.type, info.symlink_target) == (e2b.FileType.FILE, "/home/user/dir/target.txt")
    assert info.mode == (kernel.work / "dir" / "target.txt").stat().st_mode & 0o7777
    assert sandbox.files.get_info("to-dir").type == e2b.FileType.DIR
    assert sandbox.files.get_info("dangling").type is None
    listed = {e.name: e for e in sandbox.files.list("/home/user/dir")}
    assert listed["link.txt"].type == e2b.FileType.FILE
    assert listed["target.txt"].symlink_target is None
    sandbox.files.remove("/home/user/dir/link.txt")
    assert sandbox.files.read("/home/user/dir/target.txt") == "hello"


def test_a_gzip_upload_is_stored_decompressed(e2b_env: str, kernel: Kernel) -> None:
    sandbox = Sandbox.create()
    info = sandbox.files.write("/home/user/z.txt", "zipped text", gzip=True)
    assert info.path == "/home/user/z.txt"
    assert (kernel.work / "z.txt").read_bytes() == b"zipped text"
    assert sandbox.files.read("z.txt") == "zipped text"
    sandbox.files.write_files(
        [WriteEntry(path="m1.bin", data=b"\x00one"), WriteEntry(path="m2", data="two")],
        gzip=True,
    )
    assert (kernel.work / "m1.bin").read_bytes() == b"\x00one"
    assert sandbox.files.read("m2") == "two"


def _upload(url: str, sandbox: Sandbox, **request: Any) -> Any:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox._envd_access_token or "",
        **request.pop("headers", {}),
    }
    return httpx.post(f"{url}/e2b/sandbox/files", headers=headers, **request)


def test_gzip_parts_are_decoded_and_a_gzip_bomb_is_refused(e2b_env: str, kernel: Kernel) -> None:
    sandbox = Sandbox.create()
    body = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="p.txt"\r\n'
        b"Content-Type: application/octet-stream\r\nContent-Encoding: gzip\r\n\r\n"
        + gzip.compress(b"part")
        + b"\r\n--b--\r\n"
    )
    sent = _upload(
        e2b_env, sandbox, content=body, headers={"Content-Type": "multipart/form-data; boundary=b"}
    )
    assert sent.status_code == 200, sent.text
    assert (kernel.work / "p.txt").read_bytes() == b"part"
    bomb = gzip.compress(b"\0" * (MAX_FILE_CHARS * 4))
    refused = _upload(
        e2b_env,
        sandbox,
        content=bomb,
        params={"path": "bomb"},
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert refused.status_code == 413
    assert refused.json()["code"] == 413 and "decompressed" in refused.json()["message"]
    assert not (kernel.work / "bomb").exists()


def _parts(*names: str) -> list[tuple[str, tuple[str, bytes]]]:
    return [("file", (name, name.encode())) for name in names]


def test_an_upload_is_bounded_charged_per_part_and_reads_the_session_once(
    tmp_path: Path, kernel: Kernel, sessions: FakeSessionService
) -> None:
    limits = {"requests_per_second": 1, "request_burst": 6}
    app = e2b_app(tmp_path, kernel, sessions, limits, max_upload_parts=3)
    app.state.admission = AdmissionControl(FakeClock())
    with served(app) as url:
        sandbox = _create(url, "bounded")  # a request: 5 left
        headers = {
            "E2b-Sandbox-Id": sandbox["sandboxID"],
            "X-Access-Token": sandbox["envdAccessToken"],
        }
        upload = f"{url}/e2b/sandbox/files"
        reads = sessions.reads
        sent = httpx.post(upload, files=_parts("a", "b", "c"), headers=headers)  # 3: 2 left
        assert sent.status_code == 200, sent.text
        assert [f["name"] for f in sent.json()] == ["a", "b", "c"]
        assert sessions.reads - reads == 1
        too_many = httpx.post(upload, files=_parts(*"defg"), headers=headers)  # 1: 1 left
        assert too_many.status_code == 400
        assert too_many.json()["code"] == 400
        assert "Maximum number of files is 3" in too_many.json()["message"]
        assert not (kernel.work / "d").exists()
        limited = httpx.post(upload, files=_parts("h", "i"), headers=headers)  # 1, then none
        assert limited.status_code == 429
        assert limited.json()["code"] == 429 and limited.headers["Retry-After"]
        assert not (kernel.work / "h").exists()


def test_a_sandbox_past_its_end_refuses_its_token(
    gateway: str, sessions: FakeSessionService
) -> None:
    sandbox = _create(gateway, "ended")
    token = sandbox["envdAccessToken"]
    stored = sessions.objects[("ns-alice", sandbox["sandboxID"])]
    stored["metadata"]["annotations"][protocol.END_ANNOTATION] = "2020-01-01T00:00:00+00:00"
    gone = _data_plane(gateway, sandbox, token, "/files?path=x")
    assert gone.status_code == 404 and "ended" in gone.json()["message"]
    assert ("ns-alice", sandbox["sandboxID"]) in sessions.deleted  # killed at its end
    assert _data_plane(gateway, sandbox, token).status_code == 502


def test_an_upload_is_decoded_within_its_limit() -> None:
    assert protocol.decoded_upload(b"raw", None, 3) == b"raw"
    assert protocol.decoded_upload(b"raw", "identity", 3) == b"raw"
    assert protocol.decoded_upload(gzip.compress(b"abc"), "gzip", 3) == b"abc"
    members = gzip.compress(b"ab") + gzip.compress(b"c")
    assert protocol.decoded_upload(members, "x-gzip", 3) == b"abc"
    refusals = [
        (gzip.compress(b"abcd"), "gzip", 413),
        (gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 413),
        (gzip.compress(b"abc")[:-4], "gzip", 400),
        (b"not gzip", "gzip", 400),
        (gzip.compress(b"abc") + b"junk", "gzip", 400),
        (b"abc", "br", 415),
    ]
    for data, encoding, status in refusals:
        with pytest.raises(E2bError) as refused:
            protocol.decoded_upload(data, encoding, 3)
        assert refused.value.status == status, (data, encoding)


def test_unsupported_calls_answer_a_clear_error(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    with pytest.raises(e2b.SandboxException, match="cannot be paused"):
        sandbox.pause()
    with pytest.raises(e2b.SandboxException, match="not found; sandpod serves"):
        Sandbox.create(template="desktop")
    with pytest.raises(e2b.SandboxException, match="no network"):
        Sandbox.create(allow_internet_access=True)


def test_what_sandpod_does_not_serve_under_e2b_is_a_404_in_e2b_shape(e2b_env: str) -> None:
    # The SDK reads an error's `code`: a template's alias it cannot find is one that does not exist.
    assert e2b.Template.exists("no-such-template") is False
    for method, path in [
        ("GET", "/e2b/templates"),
        ("DELETE", "/e2b/v2/sandboxes"),
        ("PATCH", "/e2b/sandboxes/some-id"),
        ("GET", "/e2b/volumes/a/b/c"),
        ("POST", "/e2b/sandbox/unknown"),
    ]:
        answer = httpx.request(method, f"{e2b_env}{path}", headers={"X-API-KEY": KEY})
        assert answer.status_code == 404, (method, path)
        assert answer.json() == {"code": 404, "message": f"sandpod does not serve {method} {path}"}
    assert httpx.get(f"{e2b_env}/v1/nowhere").json()["error"]["code"] == "not_found"


def test_a_wrong_token_and_another_tenant_are_refused(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    url = f"{e2b_env}/e2b/sandbox/execute"
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id}
    forged = (sandbox._envd_access_token or "").rpartition(".")[0] + ".00"
    for token in (None, forged, "bob." + "0" * 64):
        sent = headers if token is None else {**headers, "X-Access-Token": token}
        answer = httpx.post(url, json={"code": "1"}, headers=sent)
        assert answer.status_code == 401, answer.text
    with pytest.raises(e2b.NotFoundException):
        Sandbox.connect(sandbox.sandbox_id, api_key=OTHER_KEY)
    assert Sandbox.list(api_key=OTHER_KEY).next_items() == []
    with pytest.raises(e2b.AuthenticationException):
        Sandbox.list(api_key="sk-nobody-0123456789").next_items()


def test_tokens_are_bound_to_the_tenant_the_sandbox_and_its_session() -> None:
    key = b"k" * 32
    token = protocol.access_token(key, "alice", "ses-1", "uid-1")
    assert token.startswith("alice.uid-1.")
    assert protocol.token_claim(token) == protocol.TokenClaim("alice", "uid-1")
    assert protocol.token_matches(key, token, "ses-1")
    assert not protocol.token_matches(key, token, "ses-2")
    assert not protocol.token_matches(b"x" * 32, token, "ses-1")
    assert not protocol.token_matches(key, "bob" + token.removeprefix("alice"), "ses-1")
    # Naming another session (the sandbox created again under its id) breaks the MAC.
    assert not protocol.token_matches(key, token.replace("uid-1", "uid-2"), "ses-1")
    assert protocol.access_token(key, "alice", "ses-1", "uid-2") != token


def _create(url: str, idempotency_key: str) -> dict[str, Any]:
    headers = {"X-API-KEY": KEY, "Idempotency-Key": idempotency_key}
    created = httpx.post(f"{url}/e2b/sandboxes", json={"templateID": "base"}, headers=headers)
    assert created.status_code == 201, created.text
    return dict(created.json())


def _data_plane(url: str, sandbox: dict[str, Any], token: str, path: str = "/health") -> Any:
    headers = {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": token}
    return httpx.get(f"{url}/e2b/sandbox{path}", headers=headers)


def test_a_sandbox_created_again_under_its_id_refuses_the_earlier_token(
    gateway: str, sessions: FakeSessionService
) -> None:
    first = _create(gateway, "again")
    old = first["envdAccessToken"]
    assert _data_plane(gateway, first, old).status_code == 204  # this replica knows it now
    # Killed elsewhere (another replica, or its end): this replica is not told.
    sessions.objects.pop(("ns-alice", first["sandboxID"]))
    assert _data_plane(gateway, first, old).status_code == 502  # is_running() False
    again = _create(gateway, "again")
    assert again["sandboxID"] == first["sandboxID"]
    assert again["envdAccessToken"] != old
    refused = _data_plane(gateway, again, old, "/files?path=x")
    assert refused.status_code == 401
    assert refused.json() == {
        "code": 401,
        "message": "This access token is an earlier sandbox's with this id",
    }
    assert _data_plane(gateway, again, old).status_code == 401
    assert _data_plane(gateway, again, again["envdAccessToken"]).status_code == 204


def test_the_metadata_filter_reads_what_the_sdk_sends() -> None:
    from urllib.parse import quote, urlencode

    sent = urlencode({quote("a b"): quote("c&d=e"), "k": "v"})
    assert protocol.metadata_query(sent) == {"a b": "c&d=e", "k": "v"}
    assert protocol.metadata_query(None) == {}


def test_metadata_is_bounded() -> None:
    with pytest.raises(E2bError):
        protocol.checked_metadata({str(i): "" for i in range(protocol.MAX_METADATA_ENTRIES + 1)})
    with pytest.raises(E2bError):
        protocol.checked_metadata({"a": 1})


def test_pages_follow_their_token() -> None:
    sessions = [
        {"metadata": {"name": f"ses-{i}", "creationTimestamp": f"2026-11-26T10:00:0{i}Z"}}
        for i in range(5)
    ]
    first, token = protocol.page_of(sessions, 2, None, "asc")
    assert [s["metadata"]["name"] for s in first] == ["ses-0", "ses-1"]
    second, token = protocol.page_of(sessions, 2, token, "asc")
    assert [s["metadata"]["name"] for s in second] == ["ses-2", "ses-3"]
    last, token = protocol.page_of(sessions, 2, token, "asc")
    assert ([s["metadata"]["name"] for s in last], token) == (["ses-4"], None)
    with pytest.raises(E2bError):
        protocol.page_of(sessions, 2, "ses-9", "asc")


def _sandbox(name: str, created: str, started: str | None = None, **annotations: str) -> Any:
    if started is not None:
        annotations[protocol.STARTED_ANNOTATION] = started
    return {
        "metadata": {"name": name, "creationTimestamp": created, "annotations": annotations},
        "status": {"phase": "Ready"},
    }


def test_a_sandbox_starts_to_the_microsecond_and_lists_by_that() -> None:
    second = "2026-11-26T10:00:05Z"
    first = _sandbox("ses-b", second, "2026-11-26T10:00:05.000100+00:00")
    then = _sandbox("ses-a", second, "2026-11-26T10:00:05.900000+00:00")
    older = _sandbox("ses-c", "2026-11-26T10:00:04Z")
    now = protocol.now()
    assert protocol.listed_sandbox(then, now)["startedAt"] == "2026-11-26T10:00:05.900000+00:00"
    assert protocol.listed_sandbox(older, now)["startedAt"] == "2026-11-26T10:00:04+00:00"
    page, _ = protocol.page_of([first, then, older], 10, None, "desc")
    assert [s["metadata"]["name"] for s in page] == ["ses-a", "ses-b", "ses-c"]
    since = datetime(2026, 11, 26, 10, 0, 5, 100, tzinfo=UTC)
    admitted = protocol.SandboxFilter({}, started_after=since)
    assert [admitted.admits(s) for s in (first, then, older)] == [True, True, False]
    naive = protocol.SandboxFilter({}, started_after=since.replace(tzinfo=None, microsecond=101))
    assert [naive.admits(s) for s in (first, then)] == [False, True]
    interpreter = _sandbox("ses-d", second, **{protocol.TEMPLATE_ANNOTATION: "code-interpreter-v1"})
    assert protocol.SandboxFilter({}, template="code-interpreter-v1").admits(interpreter)
    assert not protocol.SandboxFilter({}, template="code-interpreter-v1").admits(first)
    assert not protocol.SandboxFilter({"k": "v"}).admits(first)


def _result(**fields: Any) -> ExecutionResult:
    return ExecutionResult(id="cx-1", language="python", **fields)


def _cell(answer: object, **fields: Any) -> list[dict[str, Any]]:
    value = answer if isinstance(answer, str) or answer is None else json.dumps(answer)
    result = _result(status=ExecutionStatus.success, exit_code=0, result=value, **fields)
    return [json.loads(line) for line in protocol.execute_lines(result)]


def test_execute_lines_carry_the_figures_the_results_and_the_end() -> None:
    png = FileOutput(
        path="figure-1.png",
        size=3,
        media_type="image/png",
        sha256="0" * 64,
        stored=True,
        content_base64="iVBO",
    )
    answer = {"results": [{"text": "3", "is_main_result": True}], "error": None, "count": 2}
    lines = _cell(answer, stdout="hi\n", files=[png])
    assert [line["type"] for line in lines] == [
        "stdout",
        "result",
        "result",
        "number_of_executions",
        "end_of_execution",
    ]
    assert lines[1]["png"] == "iVBO"
    assert lines[2] == {"type": "result", "text": "3", "is_main_result": True}
    assert lines[3]["execution_count"] == 2


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "False",
        "not json",
        "[1]",
        "1" * (protocol.MAX_ANSWER_BYTES + 1),
        "[" * 100_000 + "]" * 100_000,
        {"results": [], "error": None},
        {"results": [{"text": 3}], "error": None, "count": 1},
        {"results": [{"text": "a", "bogus": 1}], "error": None, "count": 1},
        {"results": [{"text": "a"}] * (protocol.MAX_DISPLAYS + 2), "error": None, "count": 1},
        {"results": [], "error": {"name": "E"}, "count": 1},
        {"error": ["internal", "KeyError: 'x'"]},
    ],
)
def test_a_malformed_answer_is_a_sandpod_error(answer: object) -> None:
    lines = _cell(answer, stdout="out\n")
    assert [line["type"] for line in lines] == ["stdout", "error", "end_of_execution"]
    assert lines[1]["name"] == "SandpodError"


def test_an_error_the_module_names_is_refused_by_its_status() -> None:
    with pytest.raises(E2bError) as refused:
        protocol.session_answer(json.dumps({"error": ["not_found", "context 'x' not found"]}))
    assert refused.value.status == 404


def test_a_run_the_platform_ended_is_an_error() -> None:
    lines = [
        json.loads(line)
        for line in protocol.execute_lines(
            _result(status=ExecutionStatus.timeout, reason="DeadlineExceeded", error_message="slow")
        )
    ]
    error = lines[-2]
    assert (error["type"], error["name"], error["value"]) == ("error", "DeadlineExceeded", "slow")


def test_an_end_beyond_the_lifetime_is_refused() -> None:
    created = datetime(2026, 11, 26, tzinfo=UTC)
    protocol.check_end((created + timedelta(seconds=60)).isoformat(), "2026-11-26T00:00:00Z", 60)
    with pytest.raises(E2bError, match="at most 60 s"):
        protocol.check_end(
            (created + timedelta(seconds=61)).isoformat(), "2026-11-26T00:00:00Z", 60
        )


def test_a_killed_sandbox_is_not_running_while_its_session_ends() -> None:
    now = protocol.now()
    session: dict[str, Any] = {"metadata": {"name": "ses-1"}, "status": {"phase": "Ready"}}
    assert protocol.is_running(session, now)
    session["metadata"]["deletionTimestamp"] = now.isoformat()
    assert not protocol.is_running(session, now)
    ended = {"metadata": {"annotations": {protocol.END_ANNOTATION: now.isoformat()}}}
    assert not protocol.is_running(ended, now)


def test_a_session_answering_with_deep_nesting_is_a_502_not_a_crash() -> None:
    nested = "[" * 100_000 + "]" * 100_000
    with pytest.raises(E2bError) as refused:
        programs.answer_of(repr(nested))
    assert refused.value.status == 502


def test_a_direct_runs_record_is_known_by_its_label() -> None:
    """A kill of a direct run the operator says has ended is not sent to its record (whose
    final status may still be on its way)."""
    direct = {"metadata": {"labels": {RECORD_LABEL: RECORD_DIRECT}}}
    assert is_direct_record(direct)
    assert not is_direct_record({"metadata": {"labels": {}}})
