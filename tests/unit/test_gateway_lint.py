"""Lint on request through the agent tools: mode lint in run_code and run_in_session (one
definition, for MCP and OpenAI), the tenant's rules, diagnostics with a location."""

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gateway_fakes import (
    FakeExecutionService,
    FakeSessionService,
    Run,
    echo_runner,
    make_app,
    mcp_client,
    tenant,
)
from sandpod_contract.models import LintRules

KEY = "sk-lint-0123456789"
STRICT = "sk-strict-0123456789"
FINDINGS = [
    {"code": "E711", "message": "Comparison to `None`", "line": 2, "column": 9},
    {"code": "W191", "message": "Indentation contains tabs", "line": 3, "column": 1},
]


def linter(spec: dict[str, Any]) -> Run:
    """Lints find FINDINGS; runs echo their source."""
    if spec.get("mode") != "lint":
        return echo_runner(spec)
    return Run(
        {"phase": "Succeeded", "reason": "Completed", "exitCode": 1, "diagnostics": FINDINGS}
    )


@pytest.fixture
def service() -> FakeExecutionService:
    return FakeExecutionService(linter)


@pytest.fixture
def app(tmp_path: Path, service: FakeExecutionService, sessions: FakeSessionService) -> FastAPI:
    strict = LintRules(select=["E", "F"], ignore=["E501"])
    keys = {KEY: tenant("agents"), STRICT: tenant("strict")}
    keys[STRICT] = replace(keys[STRICT], lint=strict)
    return make_app(service, keys, kubeconfig_dir=tmp_path, sessions=sessions)


def client_for(app: FastAPI, key: str = KEY) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {key}"})


WANT = [
    {**FINDINGS[0], "location": {"line": 2, "column": 9}},
    {**FINDINGS[1], "location": {"line": 3, "column": 1}},
]


def test_the_openai_tools_take_mode_on_run_code_and_run_in_session(app: FastAPI) -> None:
    tools = {
        t["function"]["name"]: t["function"] for t in client_for(app).get("/v1/tools/openai").json()
    }

    for name in ("run_code", "run_in_session"):
        parameters = tools[name]["parameters"]
        assert parameters["properties"]["mode"]["enum"] == ["run", "lint"]
        assert "mode" not in parameters["required"]
        assert "location" in parameters["properties"]["mode"]["description"]
    for name in ("open_session", "close_session"):
        assert "mode" not in tools[name]["parameters"]["properties"]
    # The tool's arguments are the REST body: a call is answered by POSTing them as they are.
    call = {"language": "python", "code": "if x == None:\n\tpass\n", "mode": "lint"}
    result = client_for(app).post("/v1/executions", json=call).json()
    assert (result["mode"], result["diagnostics"]) == ("lint", WANT)


async def test_an_mcp_client_lints_with_run_code_and_run_in_session(
    app: FastAPI, service: FakeExecutionService
) -> None:
    async with mcp_client(app, KEY) as client:
        schemas = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
        linted = await client.call_tool(
            "run_code", {"language": "python", "code": "x == None", "mode": "lint"}
        )
        opened = await client.call_tool("open_session", {"language": "python"})
        assert opened.structured_content is not None
        session_id = opened.structured_content["id"]
        in_session = await client.call_tool(
            "run_in_session", {"session_id": session_id, "code": "x == None", "mode": "lint"}
        )
        ran = await client.call_tool("run_in_session", {"session_id": session_id, "code": "1"})

    for name in ("run_code", "run_in_session"):
        mode = schemas[name]["properties"]["mode"]
        assert [v.get("enum") for v in mode["anyOf"]] == [["run", "lint"], None]
        assert "mode" not in schemas[name]["required"]
    for result in (linted, in_session):
        assert not result.is_error
        assert result.structured_content is not None
        assert result.structured_content["diagnostics"] == WANT
    assert ran.structured_content is not None and ran.structured_content["mode"] == "run"
    specs = [created["spec"] for created in service.created]
    assert [(s["mode"], s.get("session")) for s in specs] == [
        ("lint", None),
        ("lint", None),
        ("run", session_id),
    ]
    # Without rules of the tenant's own, the operator applies the language's.
    assert all("lint" not in s for s in specs)


def test_a_tenants_lint_rules_go_into_its_lints(
    app: FastAPI, service: FakeExecutionService
) -> None:
    client = client_for(app, STRICT)
    client.post("/v1/executions", json={"language": "python", "code": "x", "mode": "lint"})
    client.post("/v1/executions", json={"language": "python", "code": "x"})

    lint, run = (created["spec"] for created in service.created)
    assert lint["lint"] == {"select": ["E", "F"], "ignore": ["E501"]}
    assert "lint" not in run


def test_the_tenant_says_whether_its_lints_have_rules_of_their_own(app: FastAPI) -> None:
    assert client_for(app).get("/v1/tenant").json()["lint_rules"] is None
    strict = client_for(app, STRICT).get("/v1/tenant").json()["lint_rules"]
    assert strict == {"select": ["E", "F"], "ignore": ["E501"]}


def test_the_languages_say_which_rules_a_lint_checks(app: FastAPI) -> None:
    languages = {
        language["name"]: language
        for language in client_for(app).get("/v1/languages").json()["languages"]
    }

    rules = languages["python"]["lint_rules"]
    assert rules["select"] == ["ALL"]
    assert {"COM812", "CPY", "D100", "D203", "D213", "FBT", "RUF029"} == set(rules["ignore"])
    assert (languages["bash"]["lint"], languages["bash"]["lint_rules"]) == (False, None)
