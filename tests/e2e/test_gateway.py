"""The gateway end to end: a uvicorn process against the cluster, with the operator running
(the session's `gateway` fixture, cluster_fixtures.py).

Each test gets fresh tenant namespaces and API keys, added to the gateway's keys Secret.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from chart_release import REQUEST_TIMEOUT, DeployedGateway
from kubernetes import client
from sandpod_contract.models import TERMINAL_PHASES
from sandpod_testkit.expected import AGENT_TOOLS
from sandpod_testkit.kube import GROUP, PLURAL, VERSION
from sandpod_testkit.quotas import wait_for_quotas
from sandpod_testkit.sse import iter_sse
from sandpod_testkit.waiting import wait_until

LIVE_PROGRAM = """\
import time
print("first", flush=True)
time.sleep(2)
print("second", flush=True)
"""
SLEEPER = "import time\ntime.sleep(90)\n"


@pytest.fixture
def other_namespace(core_v1: client.CoreV1Api, namespace: str) -> Iterator[str]:
    """A second fresh namespace, for a second tenant."""
    name = f"{namespace[:50]}-other"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core_v1.delete_namespace(name, propagation_policy="Background", grace_period_seconds=0)


@pytest.fixture
def alice(gateway: DeployedGateway, namespace: str) -> Iterator[httpx.Client]:
    """A tenant in the test's namespace that may run one execution at a time."""
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=120, maxConcurrent=1)
    with gateway.client(key) as http:
        yield http


def run(http: httpx.Client, code: str, **fields: Any) -> httpx.Response:
    return http.post("/v1/executions", json={"language": "python", "code": code, **fields})


def start(http: httpx.Client, code: str, **fields: Any) -> str:
    response = http.post(
        "/v1/executions",
        params={"wait": "false"},
        json={"language": "python", "code": code, **fields},
    )
    assert response.status_code == 202, response.text
    execution_id: str = response.json()["id"]
    return execution_id


def test_run_waits_for_the_result(alice: httpx.Client) -> None:
    success = run(alice, "print(2 + 2)")
    failure = run(alice, "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)")

    assert success.status_code == 200, success.text
    result = success.json()
    assert result["status"] == "success"
    assert result["stdout"] == "4\n"
    assert result["exit_code"] == 0
    assert isinstance(result["execution_time_ms"], int)
    assert failure.json()["status"] == "error"
    assert failure.json()["exit_code"] == 3
    assert failure.json()["stderr"] == "bad\n"


def test_stream_delivers_output_while_the_program_runs(alice: httpx.Client) -> None:
    execution_id = start(alice, LIVE_PROGRAM)

    arrivals: list[tuple[float, str, Any]] = []
    with alice.stream("GET", f"/v1/executions/{execution_id}/stream") as response:
        assert response.status_code == 200
        for event, data in iter_sse(response.iter_lines()):
            arrivals.append((time.monotonic(), event, data))

    events = [event for _, event, _ in arrivals]
    assert events[-1] == "exit", events
    assert arrivals[-1][2]["status"] == "success"
    stdout = [(at, data["data"]) for at, event, data in arrivals if event == "stdout"]
    assert "".join(text for _, text in stdout) == "first\nsecond\n"
    first_at = next(at for at, text in stdout if "first" in text)
    second_at = next(at for at, text in stdout if "second" in text)
    # "first" came in its own event, while the program was still sleeping before "second".
    assert first_at < second_at
    assert second_at - first_at >= 1.0


def test_cancel_stops_a_running_execution(alice: httpx.Client) -> None:
    execution_id = start(alice, SLEEPER, timeout_seconds=120)

    cancelled = alice.delete(f"/v1/executions/{execution_id}")

    assert cancelled.status_code == 202, cancelled.text
    result = wait_until(
        lambda: (
            (r := alice.get(f"/v1/executions/{execution_id}").json())["status"] == "cancelled" and r
        ),
        timeout=60,
        what="the execution to be cancelled",
    )
    assert "cancel" in result["error_message"]


def test_another_tenants_execution_is_404(
    gateway: DeployedGateway, alice: httpx.Client, other_namespace: str
) -> None:
    execution_id = run(alice, "print(1)").json()["id"]
    bob_key = gateway.add_tenant(other_namespace, other_namespace)

    with gateway.client(bob_key) as bob:
        assert bob.get(f"/v1/executions/{execution_id}").status_code == 404
        assert bob.delete(f"/v1/executions/{execution_id}").status_code == 404
        assert bob.get(f"/v1/executions/{execution_id}/stream").status_code == 404
        assert bob.get("/v1/executions").json()["items"] == []
    with gateway.client("sk-not-a-key") as stranger:
        assert stranger.get(f"/v1/executions/{execution_id}").status_code == 401


def test_a_retried_create_returns_the_same_execution(
    alice: httpx.Client, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    headers = {"Idempotency-Key": f"retry-{uuid.uuid4()}"}
    body = {"language": "python", "code": "print('once')"}

    first = alice.post("/v1/executions", json=body, headers=headers)
    retry = alice.post("/v1/executions", json=body, headers=headers)

    assert first.status_code == retry.status_code == 200
    assert retry.json()["id"] == first.json()["id"]
    assert retry.json()["stdout"] == "once\n"
    listed = custom_objects.list_namespaced_custom_object(
        "sandpod.dev", "v1alpha1", namespace, "codeexecutions"
    )
    assert len(listed["items"]) == 1


def test_over_the_concurrency_limit_is_429(alice: httpx.Client) -> None:
    running = start(alice, SLEEPER, timeout_seconds=120)
    try:
        refused = alice.post(
            "/v1/executions", params={"wait": "false"}, json={"language": "python", "code": "1"}
        )

        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "concurrency_limit"
    finally:
        alice.delete(f"/v1/executions/{running}")


def test_a_tenant_at_its_object_quota_gets_429_naming_it(
    gateway: DeployedGateway,
    namespace: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    """A ResourceQuota of two executions (as the chart's sandpod-objects, only tiny): the
    third create is refused, 429 quota_exceeded naming the quota; the two accepted are kept
    and finish."""
    quota = "tiny-objects"
    core_v1.create_namespaced_resource_quota(
        namespace,
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name=quota),
            spec=client.V1ResourceQuotaSpec(hard={f"count/{PLURAL}.{GROUP}": "2"}),
        ),
    )
    wait_for_quotas(core_v1, namespace)
    key = gateway.add_tenant(namespace, namespace, maxConcurrent=5)

    with gateway.client(key) as http:
        accepted = [start(http, f"print({n})") for n in range(2)]
        refused = http.post(
            "/v1/executions", params={"wait": "false"}, json={"language": "python", "code": "3"}
        )
        for name in accepted:
            wait_until(
                lambda name=name: finished(custom_objects, namespace, name),
                timeout=REQUEST_TIMEOUT,
                what=f"{name} to finish",
            )
        results = [http.get(f"/v1/executions/{name}").json() for name in accepted]

    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert quota in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    listed = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    assert sorted(item["metadata"]["name"] for item in listed["items"]) == sorted(accepted)
    assert [(r["status"], r["stdout"]) for r in results] == [("success", "0\n"), ("success", "1\n")]


def finished(objects: client.CustomObjectsApi, namespace: str, name: str) -> bool:
    execution: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return execution.get("status", {}).get("phase") in TERMINAL_PHASES


async def test_an_mcp_client_lists_and_runs_run_code(
    gateway: DeployedGateway, namespace: str
) -> None:
    key = gateway.add_tenant(namespace, namespace)

    async with gateway.mcp(key) as mcp:
        tools = (await mcp.list_tools()).tools
        result = await mcp.call_tool("run_code", {"language": "python", "code": "print(6 * 7)"})

    assert [tool.name for tool in tools] == AGENT_TOOLS
    assert not result.is_error, result.content
    assert result.structured_content is not None
    assert result.structured_content["status"] == "success"
    assert result.structured_content["stdout"] == "42\n"
