"""MCP at /mcp: an MCP client lists run_code and runs code through the gateway."""

from pathlib import Path

import pytest
from fastapi import FastAPI
from gateway_fakes import (
    FakeExecutionService,
    FakeSessionService,
    http_client,
    make_app,
    mcp_client,
    tenant,
)
from sandpod_contract.catalog import load_catalog
from sandpod_testkit.expected import AGENT_TOOLS, CATALOG_LANGUAGES

KEY = "sk-mcp-0123456789"


@pytest.fixture
def app(tmp_path: Path, service: FakeExecutionService, sessions: FakeSessionService) -> FastAPI:
    return make_app(service, {KEY: tenant("agents")}, kubeconfig_dir=tmp_path, sessions=sessions)


async def test_an_mcp_client_lists_and_calls_run_code(
    app: FastAPI, service: FakeExecutionService
) -> None:
    async with mcp_client(app, KEY) as client:
        tools = (await client.list_tools()).tools
        result = await client.call_tool("run_code", {"language": "python", "code": "print(5)"})

    assert [t.name for t in tools] == AGENT_TOOLS
    tool = tools[0]
    assert tool.input_schema["properties"]["language"]["enum"] == CATALOG_LANGUAGES
    described = tool.input_schema["properties"]["language"]["description"]
    for name, language in load_catalog().languages.items():
        assert f"{name} ({language.version})" in described
    assert tool.input_schema["required"] == ["language", "code"]
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["status"] == "success"
    assert result.structured_content["stdout"] == "print(5)"
    [created] = service.created
    assert created["metadata"]["namespace"] == "ns-agents"


async def test_run_code_errors_are_tool_errors(app: FastAPI) -> None:
    async with mcp_client(app, KEY) as client:
        result = await client.call_tool("run_code", {"language": "cobol", "code": "x"})

    assert result.is_error
    assert "unknown_language" in str(result.content)


async def test_mcp_without_a_valid_key_is_401(app: FastAPI) -> None:
    for key in (None, "sk-wrong"):
        async with http_client(app, key) as http:
            response = await http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Accept": "application/json, text/event-stream"},
            )
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"


async def test_an_mcp_client_opens_a_session_runs_in_it_twice_and_closes_it(
    app: FastAPI, service: FakeExecutionService, sessions: FakeSessionService
) -> None:
    async with mcp_client(app, KEY) as client:
        opened = await client.call_tool("open_session", {"language": "python"})
        assert opened.structured_content is not None
        session_id = opened.structured_content["id"]
        runs = [
            await client.call_tool("run_in_session", {"session_id": session_id, "code": code})
            for code in ("x = 41", "x + 1")
        ]
        command = await client.call_tool(
            "run_command", {"session_id": session_id, "command": "ls -la"}
        )
        closed = await client.call_tool("close_session", {"session_id": session_id})
        gone = await client.call_tool("run_in_session", {"session_id": session_id, "code": "x"})

    assert opened.structured_content["status"] == "ready"
    assert [run.structured_content["status"] for run in runs if run.structured_content] == [
        "success",
        "success",
    ]
    assert [created["spec"]["session"] for created in service.created] == [session_id] * 3
    *codes, started = [created["spec"]["source"] for created in service.created]
    assert codes == ["x = 41", "x + 1"]
    assert "subprocess.run" in started and "'ls -la'" in started
    assert command.structured_content is not None
    assert command.structured_content["status"] == "success"
    assert not closed.is_error
    assert sessions.deleted == [("ns-agents", session_id)]
    assert gone.is_error
    assert "not_found" in str(gone.content)
