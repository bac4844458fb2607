"""Chart settings that platform teams turn on, each installed as a release of its own: a cold
run, a pool run and a session run through the chart's gateway work under each, and an
allowlist naming the API server is refused (by the admission policy, or by the operator when
the policy is off).

Every case starts from the platform's settings (release_settings.platform_values: egress to
the API server only with its real addresses, ingress from the node, the egress proxy, the
admission policies) and changes one thing. The release's tenant is the chart's own: its
namespace, key digest, pool and quota come from the values.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from chart_release import (
    REQUEST_TIMEOUT,
    ChartRelease,
    DeployedGateway,
    bearer,
    installed,
    new_api_key,
)
from cluster_fixtures import ReleaseFactory
from executions import RECORD_TIMEOUT, wait_for
from kubernetes import client
from pool_helpers import pool_counts
from sandpod_testkit.kube import api_server_cidrs
from sandpod_testkit.waiting import wait_until

CASES: dict[str, dict[str, Any]] = {
    "hardened": {},
    "chart-defaults": {
        "networkPolicies": {"ingressFrom": [], "apiServerEgress": {"enabled": False}}
    },
    "two-gateway-replicas": {"gateway": {"replicas": 2}},
    "tenant-resource-quota": {},  # the tenant's quota: see tenant_values
    "no-egress-proxy": {"egressProxy": {"enabled": False}},
    "no-admission-policies": {
        "egress": {"admissionPolicy": False},
        "labelPolicy": {"enabled": False},
    },
}
QUOTA = {"pods": "12", "limits.memory": "8Gi", "limits.cpu": "8"}


@dataclass
class Installed:
    release: ChartRelease
    gateway: DeployedGateway
    tenant_namespace: str
    key: str
    admission_policy: bool


def tenant_values(case: str, namespace: str, digest: str) -> dict[str, Any]:
    tenant: dict[str, Any] = {
        "name": "team",
        "namespace": namespace,
        "apiKeys": [{"name": "settings", "sha256": digest}],
        "limits": {"maxConcurrent": 4, "maxSessions": 4},
        "pools": [{"name": "py", "language": "python", "size": 1}],
    }
    if case == "tenant-resource-quota":
        tenant["resourceQuota"] = QUOTA
    return {"tenants": [tenant]}


@pytest.fixture(scope="module", params=list(CASES))
def installed_case(
    request: pytest.FixtureRequest, new_release: ReleaseFactory, namespace_prefix: str
) -> Iterator[Installed]:
    case: str = request.param
    prefix = f"{namespace_prefix}cs{list(CASES).index(case)}"
    key, digest = new_api_key()
    tenant_namespace = f"{prefix}-team-{uuid.uuid4().hex[:4]}"
    values = {**CASES[case], **tenant_values(case, tenant_namespace, digest)}
    with installed(new_release(prefix, values)) as release:
        gateway = release.gateway()
        gateway.wait_ready()
        yield Installed(
            release=release,
            gateway=gateway,
            tenant_namespace=tenant_namespace,
            key=key,
            admission_policy=case != "no-admission-policies",
        )


def run(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/executions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def start_mode(custom_objects: client.CustomObjectsApi, namespace: str, name: str) -> str:
    """How the execution started, once it has its final status (a run on the direct path is
    recorded behind its answer)."""
    execution = wait_for(custom_objects, namespace, name, timeout=RECORD_TIMEOUT)
    return str(execution["status"].get("startMode"))


def test_a_cold_run(installed_case: Installed, custom_objects: client.CustomObjectsApi) -> None:
    with installed_case.gateway.client(installed_case.key) as http:
        result = run(http, {"language": "bash", "code": "echo cold"})
    assert (result["status"], result["stdout"]) == ("success", "cold\n"), result
    mode = start_mode(custom_objects, installed_case.tenant_namespace, result["id"])
    assert mode == "cold"


def test_a_pool_run(installed_case: Installed, custom_objects: client.CustomObjectsApi) -> None:
    wait_until(
        lambda: pool_counts(custom_objects, installed_case.tenant_namespace, "py")[0] >= 1,
        timeout=180,
        what="the tenant's pool to have a ready pod",
        interval=0.5,
    )
    with installed_case.gateway.client(installed_case.key) as http:
        result = run(http, {"language": "python", "code": "print('warm')"})
    assert (result["status"], result["stdout"]) == ("success", "warm\n"), result
    mode = start_mode(custom_objects, installed_case.tenant_namespace, result["id"])
    assert mode == "warm"


COUNTS = "n = globals().get('n', 0) + 1\nn"


def test_runs_of_one_session_through_both_replicas_keep_order_and_state(
    installed_case: Installed,
) -> None:
    urls = installed_case.gateway.pod_urls()
    assert len(urls) == installed_case.gateway.replicas
    replicas = [
        httpx.Client(base_url=url, headers=bearer(installed_case.key), timeout=REQUEST_TIMEOUT)
        for url in urls
    ]
    opened = replicas[0].post("/v1/sessions", json={"language": "python"})
    assert opened.status_code == 201, opened.text
    runs = f"/v1/sessions/{opened.json()['id']}/executions"

    def count(replica: int) -> str:
        answer = replicas[replica % len(replicas)].post(runs, json={"code": COUNTS})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["result"])

    try:
        in_turn = [count(replica) for replica in range(4)]
        with ThreadPoolExecutor(max_workers=6) as pool:
            at_once = list(pool.map(count, range(6)))
    finally:
        replicas[-1].delete(runs.removesuffix("/executions"))
        for replica in replicas:
            replica.close()

    assert in_turn == ["1", "2", "3", "4"]
    assert sorted(map(int, at_once)) == [5, 6, 7, 8, 9, 10]


def test_an_allowlist_naming_the_api_server_is_refused(
    installed_case: Installed, api_client: client.ApiClient
) -> None:
    cidrs, ports = api_server_cidrs(api_client)
    network = {"egress": "allowlist", "allow": [{"cidr": cidrs[0], "ports": [{"port": ports[0]}]}]}
    with installed_case.gateway.client(installed_case.key) as http:
        response = http.post(
            "/v1/executions", json={"language": "bash", "code": "true", "network": network}
        )
    if installed_case.admission_policy:
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
    else:
        assert response.status_code == 200, response.text
        result = response.json()
        assert (result["status"], result["reason"]) == ("sandbox_error", "InvalidSpec"), result
        message = result["error_message"]
    assert f"spec.network.allow: {cidrs[0]} overlaps " in message, message
    assert "egress rule " in message, message
