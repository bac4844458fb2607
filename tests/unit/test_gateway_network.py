"""Network through the gateway: `network` and `allow_hosts` on executions and sessions (and
the run_code and open_session tools), what the proxy refused in the result, and refusals by
the API server or the operator, with the Kubernetes side replaced by in-memory fakes."""

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gateway_fakes import (
    FakeExecutionService,
    FakeSessionService,
    Run,
    make_app,
    mcp_client,
    refusing_services,
    tenant,
)
from kubernetes_asyncio.client import ApiClient
from sandpod_gateway.kube.service import ExecutionRejected

KEY = "sk-net-0123456789"
PIP_HOSTS = {"egress": "allowlist", "allow": [{"host": "pypi.org", "ports": []}]}
# The Status the API server answers when the chart's egress admission policy refuses.
POLICY_MESSAGE = (
    "spec.network.allow: 10.0.0.0/8 overlaps 10.0.0.0/8 (private network); egress rule "
    "public-only: an allowlist may name only public addresses"
)
POLICY_REFUSAL = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'codeexecutions.sandpod.dev "cx-1" is forbidden: ValidatingAdmissionPolicy '
    "'sandpod-egress' with binding 'sandpod-egress' denied request: " + POLICY_MESSAGE,
    "reason": "Invalid",
    "code": 422,
}
# And when the CRD's schema does.
SCHEMA_REFUSAL = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'CodeExecution.sandpod.dev "cx-1" is invalid: spec.network: Invalid value: '
    '"object": network.allow must be non-empty when egress is allowlist, and empty otherwise',
    "reason": "Invalid",
    "details": {
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: network.allow must be non-empty",
                "field": "spec.network",
            }
        ]
    },
    "code": 422,
}


def proxied(spec: dict[str, Any]) -> Run:
    """Plays the operator with an egress proxy that allows only pypi.org; a run whose hosts
    are outside that ends Error/InvalidSpec, as the operator ends it."""
    hosts = [rule["host"] for rule in spec["network"].get("allow", []) if "host" in rule]
    if any(host != "pypi.org" for host in hosts):
        message = (
            f"spec.network.allow: host {hosts[-1]} is outside this namespace's egress hosts; "
            "egress rule tenant: an allowlist in this namespace may name only pypi.org"
        )
        return Run({"phase": "Error", "reason": "InvalidSpec", "message": message})
    return Run(
        {
            "phase": "Succeeded",
            "exitCode": 0,
            "stdout": "fetched\n",
            "egressBlocked": [
                {"host": "other.example", "port": 80, "count": 2},
                {"host": "169.254.169.254", "port": 80, "count": 1},
            ],
        }
    )


@pytest.fixture
def service() -> FakeExecutionService:
    return FakeExecutionService(proxied)


@pytest.fixture
def app(tmp_path: Path, service: FakeExecutionService, sessions: FakeSessionService) -> FastAPI:
    return make_app(service, {KEY: tenant("net")}, kubeconfig_dir=tmp_path, sessions=sessions)


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {KEY}"})


def run(client: TestClient, **fields: Any) -> Any:
    return client.post("/v1/executions", json={"language": "python", "code": "x", **fields})


def created_network(service: FakeExecutionService) -> Any:
    return service.created[-1]["spec"]["network"]


# --- executions ---------------------------------------------------------------------------


def test_no_network_unless_asked_for(client: TestClient, service: FakeExecutionService) -> None:
    assert run(client).status_code == 200

    assert created_network(service) == {"egress": "none", "allow": []}


def test_network_is_passed_into_the_spec_as_is(
    client: TestClient, service: FakeExecutionService
) -> None:
    network = {
        "egress": "allowlist",
        "allow": [
            {"host": "pypi.org", "ports": [{"port": 443, "protocol": "TCP"}]},
            {"cidr": "203.0.113.0/24", "ports": []},
        ],
    }

    response = run(client, network=network)

    assert response.status_code == 200, response.text
    assert created_network(service) == network


@pytest.mark.parametrize(
    ("hosts", "allow"),
    [
        (["pypi.org"], [{"host": "pypi.org", "ports": []}]),
        (
            ["files.pythonhosted.org:443"],
            [{"host": "files.pythonhosted.org", "ports": [{"port": 443, "protocol": "TCP"}]}],
        ),
        (["*.Example.org"], [{"host": "*.example.org", "ports": []}]),
        (
            ["pypi.org", "pypi.org:8080"],
            [
                {"host": "pypi.org", "ports": []},
                {"host": "pypi.org", "ports": [{"port": 8080, "protocol": "TCP"}]},
            ],
        ),
    ],
)
def test_allow_hosts_becomes_an_allowlist_of_host_entries(
    client: TestClient,
    service: FakeExecutionService,
    hosts: list[str],
    allow: list[dict[str, Any]],
) -> None:
    assert run(client, allow_hosts=hosts).status_code == 200

    assert created_network(service) == {"egress": "allowlist", "allow": allow}


@pytest.mark.parametrize(
    "entry",
    ["https://pypi.org", "pypi.org/simple", "1.2.3.4", "pypi.org:0", "pypi.org:https", "", "*"],
)
def test_an_invalid_host_entry_is_422_naming_it(
    client: TestClient, service: FakeExecutionService, entry: str
) -> None:
    response = run(client, allow_hosts=["pypi.org", entry])

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    [detail] = error["details"]
    assert detail["field"] == "body.allow_hosts[1]"
    assert "host name" in detail["message"] or "at least 1 character" in detail["message"]
    assert service.created == []


def test_network_and_allow_hosts_together_are_422(client: TestClient) -> None:
    response = run(client, network=PIP_HOSTS, allow_hosts=["pypi.org"])

    assert response.status_code == 422
    assert "not both" in response.json()["error"]["details"][0]["message"]


def test_an_invalid_network_is_422_before_the_cluster(
    client: TestClient, service: FakeExecutionService
) -> None:
    response = run(client, network={"egress": "allowlist", "allow": []})

    assert response.status_code == 422
    assert "network.allow must be non-empty" in response.text
    assert service.created == []


def test_the_result_shows_what_the_proxy_refused(client: TestClient) -> None:
    result = run(client, allow_hosts=["pypi.org"]).json()

    assert result["status"] == "success"
    assert result["egress_blocked"] == [
        {"host": "other.example", "port": 80, "count": 2},
        {"host": "169.254.169.254", "port": 80, "count": 1},
    ]


def test_without_refusals_egress_blocked_is_null() -> None:
    app = make_app(FakeExecutionService(), {KEY: tenant("net")})

    result = run(TestClient(app, headers={"Authorization": f"Bearer {KEY}"})).json()

    assert result["egress_blocked"] is None


def test_a_host_the_tenant_may_not_name_ends_the_run_invalid_spec(client: TestClient) -> None:
    result = run(client, allow_hosts=["pypi.org", "data.example"]).json()

    assert result["status"] == "sandbox_error"
    assert result["reason"] == "InvalidSpec"
    assert result["retryable"] is None
    assert result["error_message"].startswith(
        "InvalidSpec: spec.network.allow: host data.example is outside this namespace's"
    )


# --- refusals by the API server -------------------------------------------------------------


class RefusingExecutions(FakeExecutionService):
    async def create(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        raise ExecutionRejected(
            POLICY_REFUSAL["message"], [("spec.network.allow", "outside the bounds")]
        )


def test_a_spec_the_api_server_refuses_is_422_with_its_message() -> None:
    app = make_app(RefusingExecutions(), {KEY: tenant("net")})
    client = TestClient(app, headers={"Authorization": f"Bearer {KEY}"})

    response = run(client, network={"egress": "allowlist", "allow": [{"cidr": "10.0.0.0/8"}]})

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_execution"
    assert POLICY_MESSAGE in error["message"]
    assert error["details"] == [{"field": "spec.network.allow", "message": "outside the bounds"}]


@pytest.mark.parametrize("status", [POLICY_REFUSAL, SCHEMA_REFUSAL])
async def test_an_api_server_refusal_becomes_execution_rejected(status: dict[str, Any]) -> None:
    async with ApiClient() as api_client:
        executions, sessions = refusing_services(api_client, status)
        for service in (executions, sessions):
            with pytest.raises(ExecutionRejected) as refused:
                await service.create("ns", {"metadata": {"name": "cx-1"}})

            assert refused.value.message == status["message"]
            causes = status.get("details", {}).get("causes", [])
            assert refused.value.causes == [(c["field"], c["message"]) for c in causes]


# --- sessions -------------------------------------------------------------------------------


def test_a_session_gets_its_network(client: TestClient, sessions: FakeSessionService) -> None:
    opened = client.post(
        "/v1/sessions", json={"language": "python", "allow_hosts": ["pypi.org", "npmjs.org:443"]}
    )
    plain = client.post("/v1/sessions", json={"language": "python"})

    assert opened.status_code == 201, opened.text
    specs = {key[1]: value["spec"] for key, value in sessions.objects.items()}
    assert specs[opened.json()["id"]]["network"] == {
        "egress": "allowlist",
        "allow": [
            {"host": "pypi.org", "ports": []},
            {"host": "npmjs.org", "ports": [{"port": 443, "protocol": "TCP"}]},
        ],
    }
    assert specs[plain.json()["id"]]["network"] == {"egress": "none", "allow": []}


def test_a_session_takes_network_too_and_refuses_a_bad_host(client: TestClient) -> None:
    opened = client.post("/v1/sessions", json={"language": "python", "network": PIP_HOSTS})
    refused = client.post("/v1/sessions", json={"language": "python", "allow_hosts": ["a b"]})

    assert opened.status_code == 201, opened.text
    assert refused.status_code == 422
    assert refused.json()["error"]["details"][0]["field"] == "body.allow_hosts[0]"


def test_runs_in_a_session_take_no_network_of_their_own(client: TestClient) -> None:
    session = client.post("/v1/sessions", json={"language": "python"}).json()["id"]

    response = client.post(
        f"/v1/sessions/{session}/executions", json={"code": "x", "allow_hosts": ["pypi.org"]}
    )

    assert response.status_code == 422


# --- tools --------------------------------------------------------------------------------


def test_the_openai_tools_offer_allow_hosts_to_run_code_and_open_session(
    client: TestClient,
) -> None:
    tools = {t["function"]["name"]: t["function"] for t in client.get("/v1/tools/openai").json()}

    for name in ("run_code", "open_session"):
        parameter = tools[name]["parameters"]["properties"]["allow_hosts"]
        assert parameter["type"] == "array"
        assert parameter["items"]["type"] == "string"
        assert "pypi.org" in parameter["description"]
        assert "allow_hosts" not in tools[name]["parameters"]["required"]
        assert "no network unless allow_hosts" in tools[name]["description"].lower()
    for name in ("run_in_session", "run_command", "close_session"):
        assert "allow_hosts" not in tools[name]["parameters"]["properties"]


async def test_the_mcp_tools_pass_allow_hosts(
    app: FastAPI, service: FakeExecutionService, sessions: FakeSessionService
) -> None:
    async with mcp_client(app, KEY) as mcp:
        tools = (await mcp.list_tools()).tools
        schemas = {tool.name: tool.input_schema for tool in tools}
        open_world = {tool.name: tool.annotations.open_world_hint for tool in tools}
        ran = await mcp.call_tool(
            "run_code", {"language": "python", "code": "x", "allow_hosts": ["pypi.org"]}
        )
        opened = await mcp.call_tool(
            "open_session", {"language": "python", "allow_hosts": ["*.example.org:8443"]}
        )
        refused = await mcp.call_tool(
            "run_code", {"language": "python", "code": "x", "allow_hosts": ["http://x.org"]}
        )

    array, _null = schemas["run_code"]["properties"]["allow_hosts"]["anyOf"]
    # What the hosts named reach is outside the platform; closing a session is not.
    assert open_world == {
        "run_code": True,
        "open_session": True,
        "run_in_session": True,
        "run_command": True,
        "close_session": False,
    }
    assert array["type"] == "array"
    assert "allow_hosts" in schemas["open_session"]["properties"]
    assert not opened.is_error
    assert ran.structured_content is not None
    assert ran.structured_content["egress_blocked"][0]["host"] == "other.example"
    assert created_network(service) == PIP_HOSTS
    [session] = sessions.objects.values()
    assert session["spec"]["network"]["allow"] == [
        {"host": "*.example.org", "ports": [{"port": 8443, "protocol": "TCP"}]}
    ]
    assert refused.is_error
    assert "'http://x.org' must be a host name" in str(refused.content)
