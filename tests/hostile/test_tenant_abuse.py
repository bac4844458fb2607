"""One tenant's abuse of the gateway (the chart's, against the cluster): a flood of requests
from one key is refused beyond the tenant's rate while another tenant is served; a storm of
waits replaying one Idempotency-Key is refused beyond the bound while the same tenant's
print(1) still runs; the running count comes from labels (the operator's finished label);
and no one but the gateway and the operator may set those labels on executions or sessions (the
chart's admission policy), so a tenant cannot be made to look busy by someone else's objects.

Latencies are recorded in the results table and printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_release import REQUEST_TIMEOUT, ChartRelease, DeployedGateway
from executions import GROUP, PLURAL, VERSION, kubectl, manifest, wait_until
from kubernetes import client
from results_table import Row
from sandpod_contract.names import (
    FINISHED_LABEL,
    KIND,
    QUEUED_LABEL,
    SESSION_KIND,
    SESSION_PLURAL,
    TENANT_LABEL,
)

pytestmark = pytest.mark.usefixtures("sandpod_operator")

REPO_ROOT = Path(__file__).resolve().parents[2]
REPLAYS = 300
WAITS_PER_EXECUTION = 4
# The replay storm measures the wait bound, not the rate: its tenant may send it all at once.
STORM_RATE = {"requestsPerSecond": 2 * REPLAYS, "requestBurst": 2 * REPLAYS}
FLOOD = 200
FLOOD_RATE = {"requestsPerSecond": 5, "requestBurst": 10}
SLOW = "import time\ntime.sleep(20)\nprint('slept')"


def abuser(gateway: DeployedGateway, namespace: str, **limits: Any) -> httpx.AsyncClient:
    key = gateway.add_tenant(
        "abuser", namespace, maxWaitsPerExecution=WAITS_PER_EXECUTION, **limits
    )
    return async_client(gateway, key)


def async_client(gateway: DeployedGateway, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=gateway.url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=REQUEST_TIMEOUT,
        limits=httpx.Limits(max_connections=REPLAYS + 10, max_keepalive_connections=20),
    )


def test_a_flood_from_one_key_is_rate_limited_and_another_tenant_is_served(
    gateway: DeployedGateway, hostile_namespace: str, table_row: Row
) -> None:
    table_row.expected = f"most of {FLOOD} 429 rate_limited; the other tenant's print(1) 200"
    flooder = async_client(gateway, gateway.add_tenant("flooder", hostile_namespace, **FLOOD_RATE))
    neighbour = async_client(gateway, gateway.add_tenant("neighbour", hostile_namespace))

    async def run() -> tuple[list[httpx.Response], httpx.Response]:
        async with flooder, neighbour:
            flood = [asyncio.create_task(flooder.get("/v1/executions")) for _ in range(FLOOD)]
            quick = await neighbour.post(
                "/v1/executions", json={"language": "python", "code": "print(1)"}
            )
            return list(await asyncio.gather(*flood)), quick

    answered, quick = asyncio.run(run())

    refused = [r for r in answered if r.status_code == 429]
    served = [r for r in answered if r.status_code == 200]
    table_row.observed = f"429: {len(refused)}, 200: {len(served)}; print(1) {quick.status_code}"
    assert len(refused) + len(served) == FLOOD, sorted({r.status_code for r in answered})
    assert len(refused) > FLOOD // 2
    for response in refused:
        error = response.json()["error"]
        assert error["code"] == "rate_limited"
        assert error["details"][0]["type"] == "requests_per_second"
        assert int(response.headers["Retry-After"]) >= 1
    assert quick.status_code == 200, quick.text
    assert (quick.json()["status"], quick.json()["stdout"]) == ("success", "1\n")


async def until_answered(tasks: list[asyncio.Task[httpx.Response]], count: int) -> None:
    """Until `count` of the tasks have an answer, for at most 60 s (then the assertions tell)."""
    deadline = time.monotonic() + 60
    while sum(task.done() for task in tasks) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


async def storm(client: httpx.AsyncClient) -> tuple[list[httpx.Response], httpx.Response, float]:
    """REPLAYS waits on one Idempotency-Key for a 20 s program, and a print(1) sent while the
    program runs: (the storm's answers, print(1)'s answer, its latency in seconds)."""
    body = {"language": "python", "code": SLOW, "timeout_seconds": 40}
    headers = {"Idempotency-Key": "storm"}
    replays = [
        asyncio.create_task(client.post("/v1/executions", json=body, headers=headers))
        for _ in range(REPLAYS)
    ]
    await until_answered(replays, REPLAYS - WAITS_PER_EXECUTION)
    started = time.monotonic()
    quick = await client.post("/v1/executions", json={"language": "python", "code": "print(1)"})
    latency = time.monotonic() - started
    return list(await asyncio.gather(*replays)), quick, latency


def test_a_replay_storm_is_refused_beyond_the_bound_and_the_tenant_still_runs(
    gateway: DeployedGateway, hostile_namespace: str, table_row: Row
) -> None:
    # Each replica counts its own wait slots (docs/gateway.md, "Limits under abuse").
    bound = WAITS_PER_EXECUTION * gateway.replicas
    table_row.expected = f"≥{REPLAYS - bound} of {REPLAYS} 429; print(1) 200"

    async def run() -> tuple[list[httpx.Response], httpx.Response, float]:
        async with abuser(gateway, hostile_namespace, **STORM_RATE) as client:
            return await storm(client)

    answered, quick, latency = asyncio.run(run())

    statuses = [response.status_code for response in answered]
    refused = [r for r in answered if r.status_code == 429]
    waited = [r for r in answered if r.status_code == 200]
    table_row.observed = (
        f"429: {len(refused)}, 200: {len(waited)}; print(1) {quick.status_code} in {latency:.1f} s"
    )
    print(f"\nreplay storm: print(1) answered {quick.status_code} in {latency:.2f} s")
    assert quick.status_code == 200, quick.text
    assert (quick.json()["status"], quick.json()["stdout"]) == ("success", "1\n")
    assert len(refused) + len(waited) == REPLAYS, sorted(set(statuses))
    assert len(waited) <= bound
    for response in refused:
        assert response.json()["error"]["code"] == "too_many_waits"
        assert int(response.headers["Retry-After"]) >= 1
    assert len({r.json()["id"] for r in waited}) <= 1
    for response in waited:
        assert (response.json()["status"], response.json()["stdout"]) == ("success", "slept\n")


def test_the_running_count_follows_the_operators_finished_label(
    gateway: DeployedGateway,
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    table_row.expected = "2nd 429 concurrency_limit; after cancel: labelled, 200"

    async def run() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with abuser(gateway, hostile_namespace, maxConcurrent=1) as client:
            slow = {"language": "python", "code": SLOW, "timeout_seconds": 40}
            first = await client.post("/v1/executions?wait=false", json=slow)
            second = await client.post("/v1/executions?wait=false", json=slow)
            execution_id = first.json()["id"]
            await client.delete(f"/v1/executions/{execution_id}")
            await asyncio.to_thread(
                wait_until,
                lambda: finished_label(custom_objects, hostile_namespace, execution_id),
                timeout=60,
                what="the operator to label the cancelled execution finished",
            )
            third = await client.post(
                "/v1/executions", json={"language": "python", "code": "print(1)"}
            )
            return first, second, third

    first, second, third = asyncio.run(run())

    table_row.observed = (
        f"{first.status_code}, {second.status_code} {second.text[:40]}, {third.status_code}"
    )
    assert first.status_code == 202, first.text
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "concurrency_limit"
    assert 1 <= int(second.headers["Retry-After"]) <= 60
    assert third.status_code == 200, third.text
    assert finished_label(custom_objects, hostile_namespace, third.json()["id"], wait=True)


def finished_label(
    objects: client.CustomObjectsApi, namespace: str, name: str, wait: bool = False
) -> bool:
    def labelled() -> bool:
        execution: Any = objects.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        return bool(execution["metadata"].get("labels", {}).get(FINISHED_LABEL) == "true")

    if wait:
        wait_until(labelled, timeout=30, what=f"{name} to be labelled finished")
    return labelled()


# --- the chart's label policy ----------------------------------------------------------------


FORGED_SPECS = {
    KIND: {"language": "python", "source": "print(1)"},
    SESSION_KIND: {"language": "python"},
}


def create_as(
    kubeconfig: Path, namespace: str, who: str, labels: dict[str, str], kind: str = KIND
) -> subprocess.CompletedProcess[str]:
    """A server-side dry run of creating a CodeExecution (or, by `kind`, a CodeSession) with
    `labels`, as `who`."""
    document = {**manifest("forged", FORGED_SPECS[kind]), "kind": kind}
    document["metadata"]["labels"] = labels
    return kubectl(
        kubeconfig,
        "create",
        "--dry-run=server",
        f"--as={who}",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(document),
    )


@pytest.fixture
def accounts(
    sandpod_release: ChartRelease, hostile_namespace: str, kubeconfig_path: Path
) -> dict[str, str]:
    """Who creates executions and sessions in this test's namespace, which the session
    release's label policy covers: an "intruder" of the namespace, and the release's gateway
    and operator service accounts (all three allowed to create by a Role here)."""
    accounts = {
        "intruder": f"system:serviceaccount:{hostile_namespace}:intruder",
        "gateway": sandpod_release.gateway_account,
        "operator": sandpod_release.operator_account,
    }
    rbac = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "create-labelled", "namespace": hostile_namespace},
                "rules": [
                    {
                        "apiGroups": [GROUP],
                        "resources": [PLURAL, SESSION_PLURAL],
                        "verbs": ["create"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "create-labelled", "namespace": hostile_namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "create-labelled",
                },
                "subjects": [
                    {"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}
                    for name in accounts.values()
                ],
            },
        ],
    }
    applied = kubectl(kubeconfig_path, "apply", "-f", "-", stdin=json.dumps(rbac))
    assert applied.returncode == 0, applied.stderr
    return accounts


@pytest.mark.parametrize(
    ("who", "labels", "refused_with"),
    [
        ("intruder", {TENANT_LABEL: "victim"}, "only the sandpod gateway sets the tenant label"),
        ("intruder", {FINISHED_LABEL: "true"}, "only the sandpod operator sets the finished"),
        ("operator", {TENANT_LABEL: "victim"}, "only the sandpod gateway"),
        ("gateway", {FINISHED_LABEL: "true"}, "only the sandpod operator"),
        ("intruder", {"team": "victim"}, None),
        ("gateway", {TENANT_LABEL: "victim"}, None),
        ("intruder", {QUEUED_LABEL: "5"}, "only the sandpod gateway queues an execution"),
        ("gateway", {QUEUED_LABEL: "5"}, None),
    ],
    ids=[
        "intruder-sets-tenant",
        "intruder-sets-finished",
        "operator-sets-tenant",
        "gateway-sets-finished",
        "intruder-other-label",
        "gateway-sets-tenant",
        "intruder-queues",
        "gateway-queues",
    ],
)
def test_only_the_gateway_and_operator_set_the_counted_labels(
    accounts: dict[str, str],
    hostile_namespace: str,
    kubeconfig_path: Path,
    who: str,
    labels: dict[str, str],
    refused_with: str | None,
    table_row: Row,
) -> None:
    result = create_as(kubeconfig_path, hostile_namespace, accounts[who], labels)
    assert_created_or_refused(result, refused_with, table_row)


@pytest.mark.parametrize(
    ("who", "labels", "refused_with"),
    [
        ("intruder", {TENANT_LABEL: "victim"}, "only the sandpod gateway sets the tenant label"),
        ("intruder", {FINISHED_LABEL: "true"}, "only the sandpod operator sets the finished"),
        ("gateway", {TENANT_LABEL: "victim"}, None),
    ],
    ids=["intruder-opens-session-as-another-tenant", "intruder-ends-session", "gateway-opens"],
)
def test_only_the_gateway_opens_a_session_in_a_tenants_name(
    accounts: dict[str, str],
    hostile_namespace: str,
    kubeconfig_path: Path,
    who: str,
    labels: dict[str, str],
    refused_with: str | None,
    table_row: Row,
) -> None:
    """A session labelled with another tenant's name would count against its maxSessions and
    answer to its key; one labelled finished by anyone but the operator would be left out of
    its tenant's count."""
    result = create_as(kubeconfig_path, hostile_namespace, accounts[who], labels, SESSION_KIND)
    assert_created_or_refused(result, refused_with, table_row)


def assert_created_or_refused(
    result: subprocess.CompletedProcess[str], refused_with: str | None, table_row: Row
) -> None:
    """The dry run was accepted (`refused_with` None) or refused with that message."""
    table_row.expected = f"refused: {refused_with}" if refused_with else "accepted"
    telling = (result.stderr or result.stdout).strip()
    table_row.observed = f"exit {result.returncode}: {telling[-70:]}"
    if refused_with is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, result.stdout
        assert refused_with in result.stderr, result.stderr
