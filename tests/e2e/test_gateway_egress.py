"""Hosts asked for through the gateway, with the chart's egress proxy: a request to a host the
execution was not granted is refused by the proxy (403) and reported in the gateway's result,
and a host the tenant may not name ends the run InvalidSpec.

The proxy runs in a namespace of this module's, with an operator of the module's own pointed at
it (egress_proxy_deployment.py); the gateway is the session's. Nothing leaves the machine: the
proxy refuses other.example by the execution's grant before any name lookup, and it has no DNS
(the chart gives it none) and no host aliases here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from egress_proxy_deployment import DeployedProxy, deployed_proxy, proxy_operator
from gateway_process import Gateway
from kubernetes import client
from sandpod_testkit.components import OperatorProcess
from sandpod_testkit.kube import create_namespace, delete_executions

ALLOWED = "allowed.example"
# urllib reads HTTP_PROXY (with the execution's credentials) from the environment.
FETCH_OTHER = """
import urllib.error, urllib.request
try:
    urllib.request.urlopen("http://other.example/", timeout=15)
    print("reached")
except urllib.error.HTTPError as error:
    print(error.code)
"""


@pytest.fixture(scope="module")
def egress_prefix(namespace_prefix: str) -> str:
    """Outside the session operator's namespaces (`<prefix>-*`): this module's operator."""
    return f"{namespace_prefix}gx"


@pytest.fixture(scope="module")
def tenant_namespace(core_v1: client.CoreV1Api, egress_prefix: str) -> Iterator[str]:
    name = f"{egress_prefix}-tenant-{uuid.uuid4().hex[:4]}"
    create_namespace(core_v1, name)
    yield name
    core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def proxy(
    api_client: client.ApiClient,
    helm: Path,
    egress_prefix: str,
    node_ip: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DeployedProxy]:
    namespace = f"{egress_prefix}-proxy-{uuid.uuid4().hex[:4]}"
    with deployed_proxy(
        api_client, helm, namespace, node_ip, tmp_path_factory.mktemp("proxy")
    ) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def operator_with_proxy(
    sandpod_crd: str,
    api_client: client.ApiClient,
    kubeconfig_path: Path,
    egress_prefix: str,
    proxy: DeployedProxy,
    tenant_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    operator = proxy_operator(
        kubeconfig_path,
        api_client,
        [f"{egress_prefix}-*"],
        proxy,
        tmp_path_factory.mktemp("proxy-operator"),
        namespace_hosts={tenant_namespace: [ALLOWED]},
    )
    operator.start()
    yield operator
    # Executions carry the operator's finalizer: delete them while it still runs.
    delete_executions(client.CustomObjectsApi(api_client), tenant_namespace, timeout=60)
    operator.stop()


@pytest.fixture(scope="module")
def tenant(
    gateway: Gateway, tenant_namespace: str, operator_with_proxy: OperatorProcess
) -> Iterator[httpx.Client]:
    """A tenant whose namespace may name ALLOWED only."""
    key = gateway.add_tenant(tenant_namespace, tenant_namespace, maxTimeoutSeconds=60)
    with gateway.client(key) as http:
        yield http


def test_a_host_not_granted_is_refused_by_the_proxy_and_shown_in_the_result(
    tenant: httpx.Client,
) -> None:
    network = {"egress": "allowlist", "allow": [{"host": ALLOWED, "ports": [{"port": 80}]}]}

    response = tenant.post(
        "/v1/executions",
        json={"language": "python", "code": FETCH_OTHER, "network": network},
    )

    assert response.status_code == 200, response.text
    result = response.json()
    assert result["status"] == "success", result
    assert result["stdout"].strip() == "403"
    assert result["egress_blocked"] == [{"host": "other.example", "port": 80, "count": 1}]


def test_a_host_the_tenant_may_not_name_ends_the_run_invalid_spec(tenant: httpx.Client) -> None:
    response = tenant.post(
        "/v1/executions",
        json={"language": "python", "code": "print(1)", "allow_hosts": ["other.example"]},
    )

    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["status"], result["reason"]) == ("sandbox_error", "InvalidSpec")
    assert "host other.example is outside this namespace's egress hosts" in result["error_message"]
    assert "egress rule tenant" in result["error_message"]


def test_a_session_with_hosts_reports_each_runs_refusals(tenant: httpx.Client) -> None:
    opened = tenant.post("/v1/sessions", json={"language": "python", "allow_hosts": [ALLOWED]})
    assert opened.status_code in (200, 201), opened.text
    session_id = opened.json()["id"]
    try:
        for _ in range(2):
            response = tenant.post(
                f"/v1/sessions/{session_id}/executions", json={"code": FETCH_OTHER}
            )
            assert response.status_code == 200, response.text
            result = response.json()
            assert result["status"] == "success", result
            assert result["stdout"].strip() == "403"
            # Each run reports what the proxy refused while it ran, not the session's total.
            assert result["egress_blocked"] == [{"host": "other.example", "port": 80, "count": 1}]
    finally:
        tenant.delete(f"/v1/sessions/{session_id}")
