"""E2B's API end to end, spoken by its official SDKs (`e2b`, `e2b-code-interpreter` from PyPI,
pinned, unchanged; sync and async) to the chart's gateway: every sandbox a CodeSession the
operator runs in a gVisor pod, every cell and command a run in it over the direct path."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import e2b
import httpx
import pytest
from chart_release import DeployedGateway
from e2b_code_interpreter import AsyncSandbox, Sandbox
from kubernetes import client
from sandpod_testkit.kube import GROUP, VERSION

SESSIONS = "codesessions"
# The image's matplotlib backend turns a shown figure into a PNG output file.
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"


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
    assert sandbox.run_code("import os\nos.environ.get('WHO')", envs={"WHO": "me"}).text == "'me'"
    assert sandbox.run_code("import os\nos.environ.get('WHO')").text is None


def test_a_matplotlib_figure_comes_back_as_a_png(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(PLOT)
    assert execution.error is None, execution.error
    assert any(result.png for result in execution.results), execution.results


def test_files_and_commands_share_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/data.txt", "from the sdk\n")
    assert sandbox.run_code("open('data.txt').read()").text == "'from the sdk\\n'"
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
