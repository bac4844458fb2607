"""E2B's API end to end, spoken by its official SDKs (`e2b`, `e2b-code-interpreter` from PyPI,
pinned, unchanged; sync and async) to the chart's gateway: every sandbox a CodeSession the
operator runs in a gVisor pod, every cell and command a run in it over the direct path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import e2b
import httpx
import pytest
from chart_release import DeployedGateway
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.charts import BarChart, LineChart
from kubernetes import client
from sandpod_testkit.kube import GROUP, VERSION
from sandpod_testkit.waiting import wait_until

SESSIONS = "codesessions"
# The image's matplotlib backend turns a shown figure into a PNG output file.
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 4])\nplt.title('squares')\nplt.show()\n"
# Programs that write a line, sleep, then write another: live output hears them apart.
LIVE_GAP_SECONDS = 4
LIVE_PROGRAM = (
    f"import time\nprint('first line', flush=True)\ntime.sleep({LIVE_GAP_SECONDS})\n"
    "print('last line')\n"
)
# Long enough for a sandbox's first run under a loaded node.
RUN_SECONDS = 120
LIVE_COMMAND = f"echo first line; sleep {LIVE_GAP_SECONDS}; echo last line"


def sdk_options(gateway: DeployedGateway, key: str) -> dict[str, Any]:
    """What .cluster/e2b.env gives the SDK, as its own options (no process environment)."""
    return {
        "api_key": key,
        "api_url": f"{gateway.url}/e2b",
        "sandbox_url": f"{gateway.url}/e2b/sandbox",
    }


@pytest.fixture
def alice(gateway: DeployedGateway, namespace: str) -> dict[str, Any]:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxSessions=4)
    return sdk_options(gateway, key)


@pytest.fixture
def sandbox(alice: dict[str, Any]) -> Iterator[Sandbox]:
    box = Sandbox.create(metadata={"suite": "e2b"}, **alice)
    yield box
    box.kill()


def test_a_sandbox_is_a_session_listed_by_metadata_and_killed(
    alice: dict[str, Any], namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    box = Sandbox.create(template="base", metadata={"who": "ada"}, timeout=120, **alice)
    session = custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, SESSIONS, box.sandbox_id
    )
    assert session["spec"]["language"] == "python"
    info = box.get_info()
    assert (info.template_id, info.metadata) == ("base", {"who": "ada"})
    found = Sandbox.list(query=e2b.SandboxQuery(metadata={"who": "ada"}), **alice).next_items()
    assert [s.sandbox_id for s in found] == [box.sandbox_id]
    box.set_timeout(300)
    assert box.get_info().end_at > info.end_at
    again = Sandbox.connect(box.sandbox_id, **alice)
    assert again.run_code("6 * 7").text == "42"
    box.kill()
    assert not again.is_running()
    assert Sandbox.list(query=e2b.SandboxQuery(metadata={"who": "ada"}), **alice).next_items() == []


def test_the_list_is_newest_first_and_filtered_by_start_and_template(
    alice: dict[str, Any], sandbox: Sandbox
) -> None:
    newer = Sandbox.create(template="base", metadata={"suite": "e2b"}, **alice)

    def listed(**query: Any) -> list[str]:
        found = Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "e2b"}, **query), **alice)
        return [s.sandbox_id for s in found.next_items()]

    try:
        # Both likely started within one second: their order is the start's microseconds.
        assert listed() == [newer.sandbox_id, sandbox.sandbox_id]
        started = newer.get_info().started_at
        assert listed(started_after=started) == [newer.sandbox_id]
        assert listed(started_after=started + timedelta(seconds=1)) == []
        assert listed(template="base") == [newer.sandbox_id]
        assert listed(template="unknown-template") == []
    finally:
        newer.kill()


def test_the_operator_ends_a_sandbox_at_its_timeout_unread(
    alice: dict[str, Any], namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    box = Sandbox.create(timeout=300, **alice)
    assert box.run_code("1").text == "1"
    box.set_timeout(3)

    def ended() -> dict[str, Any] | None:
        session = custom_objects.get_namespaced_custom_object(
            GROUP, VERSION, namespace, SESSIONS, box.sandbox_id
        )
        status: dict[str, Any] = session.get("status") or {}
        return status if status.get("phase") == "Ended" else None

    # The operator looks at a live session at least every 30 s, and at once at its end.
    status = wait_until(ended, timeout=60, what="the sandbox's session to end")
    assert status["reason"] == "LifetimeExceeded"
    assert status["message"].startswith("the session reached the end set for it, ")


def test_run_code_keeps_state_and_reports_results_and_errors(sandbox: Sandbox) -> None:
    seen: list[str] = []
    first = sandbox.run_code("x = 41\nprint('set')", on_stdout=lambda m: seen.append(m.line))
    second = sandbox.run_code("x + 1")
    assert (first.logs.stdout, seen, first.error) == (["set\n"], ["set\n"], None)
    assert second.text == "42"
    assert second.execution_count == (first.execution_count or 0) + 1
    failed = sandbox.run_code("1 / 0")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
    assert "Traceback" in failed.error.traceback
    assert sandbox.run_code("import os\nos.environ.get('WHO')", envs={"WHO": "me"}).text == "me"
    assert sandbox.run_code("import os\nos.environ.get('WHO')").text is None


def test_a_cell_indented_as_a_whole_runs_as_ipython_runs_it(sandbox: Sandbox) -> None:
    cell = sandbox.run_code(
        "\n    total = 0\n    for i in range(4):\n        total += i\n    total\n"
    )
    assert (cell.error, cell.text) == (None, "6")


def _executions(custom_objects: client.CustomObjectsApi, namespace: str, name: str) -> int:
    session = custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, SESSIONS, name)
    return int((session.get("status") or {}).get("executionCount") or 0)


def test_a_cell_is_one_run_in_the_session(
    sandbox: Sandbox, namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    # The first call carries the module with the cell; every cell is exactly one run.
    cells = ["x = 1", "x + 1", "x + 2;", "def f():\n    return 1 / 0\nf()", "x"]
    executions = [sandbox.run_code(cell) for cell in cells]
    assert [e.execution_count for e in executions] == [1, 2, 3, 4, 5]
    runs = wait_until(
        lambda: (n := _executions(custom_objects, namespace, sandbox.sandbox_id)) >= 5 and n,
        timeout=60,
        what="the session's runs counted",
    )
    assert runs == len(cells)
    assert [e.text for e in executions] == [None, "2", None, None, "1"]
    error = executions[3].error
    assert error is not None and error.name == "ZeroDivisionError"
    frames = [line for line in error.traceback.splitlines() if line.startswith("  File")]
    assert frames == [
        '  File "<cell default:4>", line 3, in <module>',
        '  File "<cell default:4>", line 2, in f',
    ]


def test_env_vars_of_the_sandbox_and_of_a_cell(alice: dict[str, Any]) -> None:
    box = Sandbox.create(envs={"WHO": "sandbox", "KEEP": "k"}, **alice)
    try:
        read = "import os\n(os.environ.get('WHO'), os.environ.get('KEEP'), os.environ.get('A'))"
        assert box.run_code(read, envs={"WHO": "cell", "A": "a"}).text == "('cell', 'k', 'a')"
        assert box.run_code(read).text == "('sandbox', 'k', None)"
    finally:
        box.kill()


def test_contexts_are_namespaces_of_their_own(sandbox: Sandbox) -> None:
    sandbox.run_code("x = 'default'\nimport os\nos.makedirs('sub', exist_ok=True)")
    other = sandbox.create_code_context(cwd="/home/user/sub")
    assert (other.language, other.cwd) == ("python", "/home/user/sub")
    assert {c.id for c in sandbox.list_code_contexts()} == {"default", other.id}
    there = sandbox.run_code("import os\nx = 'other'\nos.getcwd()", context=other)
    assert (there.text, there.execution_count) == ("/tmp/work/sub", 1)
    assert sandbox.run_code("x").text == "default"
    assert sandbox.run_code("x", context=other).text == "other"
    sandbox.restart_code_context(other)
    restarted = sandbox.run_code("x", context=other)
    assert restarted.error is not None and restarted.error.name == "NameError"
    assert restarted.execution_count == 1
    with pytest.raises(e2b.SandboxException, match="400"):
        sandbox.create_code_context(language="javascript")
    with pytest.raises(e2b.SandboxException, match="400"):
        sandbox.remove_code_context("default")
    sandbox.remove_code_context(other)
    with pytest.raises(e2b.NotFoundException):
        sandbox.run_code("1", context=other)
    assert [c.id for c in sandbox.list_code_contexts()] == ["default"]


def test_a_dataframe_comes_back_as_html_and_display_as_results(sandbox: Sandbox) -> None:
    shown: list[str | None] = []
    execution = sandbox.run_code(
        "import pandas as pd\n"
        "frame = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\n"
        "display('first', frame.head(1))\n"
        "frame",
        on_result=lambda result: shown.append(result.text),
    )
    assert execution.error is None, execution.error
    assert [r.is_main_result for r in execution.results] == [False, False, True]
    assert execution.results[0].text == "first"
    main = execution.results[-1]
    assert main.html is not None and "<table" in main.html and "<td>y</td>" in main.html
    assert main.data == {"a": [1, 2], "b": ["x", "y"]}
    assert main.text is not None and "a  b" in main.text
    assert len(shown) == 3
    big = sandbox.run_code(
        "class Big:\n    def _repr_html_(self):\n        return 'x' * 100_000\nBig()"
    )
    assert big.results[0].html is None and big.results[0].text
    assert any("sandpod: result 1: its html" in line for line in big.logs.stderr)


def test_a_matplotlib_figure_comes_back_as_a_png_with_its_chart(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(PLOT)
    assert execution.error is None, execution.error
    [figure] = [result for result in execution.results if result.png]
    assert isinstance(figure.chart, LineChart)
    assert figure.chart.title == "squares"
    assert [element.points for element in figure.chart.elements] == [[(0.0, 1.0), (1.0, 4.0)]]
    bars = sandbox.run_code("plt.bar(['a', 'b'], [3, 1], label='n')\nplt.show()")
    [chart] = [result.chart for result in bars.results if result.png]
    assert isinstance(chart, BarChart)
    assert [(e.label, e.group, e.value) for e in chart.elements] == [("a", "n", 3), ("b", "n", 1)]


def test_files_and_commands_share_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/data.txt", "from the sdk\n")
    assert sandbox.run_code("open('data.txt').read()").text == "from the sdk\\n"
    sandbox.run_code("open('out.bin', 'wb').write(bytes(range(4)))")
    assert sandbox.files.read("/home/user/out.bin", format="bytes") == bytes(range(4))
    assert sandbox.files.exists("/home/user/data.txt")
    assert sandbox.files.make_dir("/home/user/sub")
    sandbox.files.rename("/home/user/data.txt", "/home/user/sub/data.txt")
    assert [e.name for e in sandbox.files.list("/home/user/sub")] == ["data.txt"]
    done = sandbox.commands.run("cat sub/data.txt; echo $WHO", envs={"WHO": "bash"})
    assert (done.stdout, done.exit_code) == ("from the sdk\nbash\n", 0)
    sandbox.files.remove("/home/user/sub")
    assert not sandbox.files.exists("/home/user/sub/data.txt")


def test_removing_what_is_not_there_is_a_no_op_and_a_symlink_is_followed(
    sandbox: Sandbox,
) -> None:
    sandbox.files.remove("/home/user/never-there.txt")
    sandbox.files.write("/home/user/links/target.txt", "hello")
    sandbox.commands.run("ln -s target.txt link.txt", cwd="/home/user/links")
    info = sandbox.files.get_info("/home/user/links/link.txt")
    assert (info.type, info.symlink_target) == (e2b.FileType.FILE, "/home/user/links/target.txt")


def test_a_gzip_upload_is_stored_as_its_content(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/zipped.txt", "sent gzipped\n", gzip=True)
    assert sandbox.commands.run("cat zipped.txt").stdout == "sent gzipped\n"
    assert sandbox.files.read("/home/user/zipped.txt") == "sent gzipped\n"


def test_the_async_sdk(alice: dict[str, Any]) -> None:
    async def use() -> tuple[str | None, list[str]]:
        box = await AsyncSandbox.create(**alice)
        try:
            seen: list[str] = []
            execution = await box.run_code(
                "print('hi')\n2 + 2", on_stdout=lambda m: seen.append(m.line)
            )
            return execution.text, seen
        finally:
            await box.kill()

    assert asyncio.run(use()) == ("4", ["hi\n"])


def test_output_streams_while_a_cell_and_a_command_run(alice: dict[str, Any]) -> None:
    """Each callback sees its first line while the program sleeps before its last one."""

    async def use() -> tuple[dict[str, float], dict[str, float]]:
        cell: dict[str, float] = {}
        command: dict[str, float] = {}
        box = await AsyncSandbox.create(**alice)
        try:
            await box.run_code(LIVE_PROGRAM, on_stdout=lambda m: heard(cell, m.line))
            await box.commands.run(LIVE_COMMAND, on_stdout=lambda line: heard(command, line))
        finally:
            await box.kill()
        return cell, command

    for lines in asyncio.run(use()):
        assert set(lines) == {"first line", "last line"}
        assert lines["last line"] - lines["first line"] >= LIVE_GAP_SECONDS / 2


def test_a_background_command_is_killed_and_the_sandbox_goes_on(alice: dict[str, Any]) -> None:
    async def use() -> tuple[bool, bool, e2b.CommandExitException, str | None]:
        box = await AsyncSandbox.create(**alice)
        try:
            started = asyncio.Event()
            handle = await box.commands.run(
                "echo started; sleep 120; echo never",
                background=True,
                on_stdout=lambda _: started.set(),
            )
            await asyncio.wait_for(started.wait(), RUN_SECONDS)
            killed = await box.commands.kill(handle.pid)
            with pytest.raises(e2b.CommandExitException) as ended:
                await handle.wait()
            again = await box.commands.kill(handle.pid)
            after = await box.run_code("1 + 1")
        finally:
            await box.kill()
        return killed, again, ended.value, after.text

    killed, again, ended, after = asyncio.run(use())
    assert (killed, again) == (True, False)
    assert ended.exit_code == -1
    assert ended.stdout == "started\n"
    assert after == "2"


def heard(lines: dict[str, float], text: str) -> None:
    for line in text.splitlines():
        lines[line] = time.monotonic()


def test_tenants_and_tokens_keep_sandboxes_apart(
    gateway: DeployedGateway, alice: dict[str, Any], sandbox: Sandbox, namespace: str
) -> None:
    bob = sdk_options(gateway, gateway.add_tenant(f"{namespace}-bob", f"{namespace}"))
    assert Sandbox.list(**bob).next_items() == []
    with pytest.raises(e2b.NotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **bob)
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id}
    token = sandbox._envd_access_token or ""
    for wrong in ("", token[:-1] + ("0" if token[-1] != "0" else "1")):
        answer = httpx.post(
            f"{gateway.url}/e2b/sandbox/execute",
            json={"code": "1"},
            headers={**headers, "X-Access-Token": wrong} if wrong else headers,
        )
        assert answer.status_code == 401, answer.text


def test_unsupported_calls_say_why(sandbox: Sandbox) -> None:
    with pytest.raises(e2b.SandboxException, match="cannot be paused"):
        sandbox.pause()


def test_what_is_not_served_answers_in_e2b_shape(
    gateway: DeployedGateway, alice: dict[str, Any]
) -> None:
    answer = httpx.get(f"{gateway.url}/e2b/templates", headers={"X-API-KEY": alice["api_key"]})
    assert answer.status_code == 404
    assert answer.json() == {"code": 404, "message": "sandpod does not serve GET /e2b/templates"}
    assert e2b.Template.exists("no-such-template", **alice) is False
