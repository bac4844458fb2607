"""The agent tools as the seeds describe them, end to end through the chart's gateway and
operator: a one-off Python run's trailing value as `result`, an uncaught exception named in
error_message as the program's words, lint on request (REST, the OpenAI tool JSON and the
official MCP client) with ruff's rules as the catalog sets them or as the tenant's are.

These need the images built from this tree (python: the runner's bootstrap; the operator:
status.result and lint rules; the gateway: mode, error_message, diagnostics' location)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from chart_release import DeployedGateway

# E711 (== None) and W191 (a tab) are outside ruff's default rules; F821 is inside.
LINTED = "if x == None:\n\tpass\n"


@pytest.fixture
def alice(gateway: DeployedGateway, namespace: str) -> Iterator[httpx.Client]:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxSessions=1)
    with gateway.client(key) as http:
        yield http


def run(http: httpx.Client, code: str, **fields: Any) -> dict[str, Any]:
    response = http.post("/v1/executions", json={"language": "python", "code": code, **fields})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def codes(result: dict[str, Any]) -> set[str]:
    return {diagnostic["code"] for diagnostic in result["diagnostics"]}


def test_a_one_off_python_run_returns_its_trailing_value(alice: httpx.Client) -> None:
    valued = run(alice, "x = 6\nprint('out')\nx * 7\n")
    printed = run(alice, "print(1)\n")
    failed = run(alice, "x = 1\nx / 0\n")

    assert (valued["status"], valued["stdout"], valued["exit_code"]) == ("success", "out\n", 0)
    assert (valued["result"], valued["reported_by"]) == ("42", "runner")
    assert (printed["stdout"], printed["result"]) == ("1\n", None)
    assert (failed["exit_code"], failed["result"]) == (1, None)


def test_an_uncaught_exception_is_named_as_the_programs_words(alice: httpx.Client) -> None:
    raised = run(alice, "pritn('hi')\n")
    exited = run(alice, "import sys\nsys.exit(1)\n")
    # The same words from another language are not read as a traceback.
    fake = "printf '  File \"x\", line 1\\nNameError: x\\n' >&2; exit 1"
    shell = alice.post("/v1/executions", json={"language": "bash", "code": fake}).json()

    assert raised["status"] == "error"
    assert raised["error_message"].startswith("the program exited with code 1; ")
    assert (
        "the last traceback on its stderr reads \"NameError: name 'pritn' is not defined"
        in (raised["error_message"])
    )
    assert exited["error_message"] == "the program exited with code 1"
    assert "NameError: x" in shell["stderr"]
    assert shell["error_message"] == "the program exited with code 1"


def test_lint_checks_nearly_all_of_ruffs_rules_with_locations(alice: httpx.Client) -> None:
    result = run(alice, LINTED, mode="lint")

    assert (result["status"], result["mode"]) == ("success", "lint")
    assert {"E711", "W191", "F821"} <= codes(result)
    tab = next(d for d in result["diagnostics"] if d["code"] == "W191")
    assert tab["location"] == {"line": 2, "column": 1} == {k: tab[k] for k in ("line", "column")}


def test_a_tenants_lint_rules_replace_the_catalogs(
    gateway: DeployedGateway, namespace: str
) -> None:
    key = gateway.add_tenant(namespace, namespace, lint={"select": ["F"]})
    with gateway.client(key) as http:
        result = run(http, LINTED, mode="lint")

    assert codes(result) == {"F821"}


def test_the_openai_tool_calls_lint_as_they_are_posted(alice: httpx.Client) -> None:
    tools = {t["function"]["name"]: t["function"] for t in alice.get("/v1/tools/openai").json()}
    assert tools["run_code"]["parameters"]["properties"]["mode"]["enum"] == ["run", "lint"]
    # What a model would send for run_code, posted unchanged.
    arguments = {"language": "python", "code": LINTED, "mode": "lint"}

    result = alice.post("/v1/executions", json=arguments).json()

    assert {"E711", "W191"} <= codes(result)


async def test_an_mcp_client_lints_with_run_code_and_in_a_session(
    gateway: DeployedGateway, namespace: str
) -> None:
    key = gateway.add_tenant(namespace, namespace, maxSessions=1)

    async with gateway.mcp(key) as mcp:
        linted = await mcp.call_tool(
            "run_code", {"language": "python", "code": LINTED, "mode": "lint"}
        )
        opened = await mcp.call_tool("open_session", {"language": "python"})
        assert opened.structured_content is not None, opened.content
        session_id = opened.structured_content["id"]
        try:
            defined = await mcp.call_tool(
                "run_in_session", {"session_id": session_id, "code": "x = 1"}
            )
            in_session = await mcp.call_tool(
                "run_in_session", {"session_id": session_id, "code": LINTED, "mode": "lint"}
            )
            after = await mcp.call_tool("run_in_session", {"session_id": session_id, "code": "x"})
        finally:
            await mcp.call_tool("close_session", {"session_id": session_id})

    for result in (linted, in_session):
        assert not result.is_error, result.content
        assert result.structured_content is not None
        assert {"E711", "W191"} <= codes(result.structured_content)
        assert result.structured_content["session"] is None
    assert not defined.is_error, defined.content
    # The lint ran beside the session: its state is as the runs left it.
    assert after.structured_content is not None
    assert after.structured_content["result"] == "1"


async def test_an_mcp_client_runs_a_shell_command_beside_its_session(
    gateway: DeployedGateway, namespace: str
) -> None:
    key = gateway.add_tenant(namespace, namespace, maxSessions=1)

    async with gateway.mcp(key) as mcp:
        opened = await mcp.call_tool("open_session", {"language": "python"})
        assert opened.structured_content is not None, opened.content
        session_id = opened.structured_content["id"]
        try:
            await mcp.call_tool(
                "run_in_session",
                {"session_id": session_id, "code": "open('notes.txt', 'w').write('from python')"},
            )
            command = await mcp.call_tool(
                "run_command", {"session_id": session_id, "command": "cat notes.txt; exit 2"}
            )
        finally:
            await mcp.call_tool("close_session", {"session_id": session_id})

    assert command.structured_content is not None, command.content
    result = command.structured_content
    assert (result["status"], result["exit_code"], result["stdout"]) == ("error", 2, "from python")
