"""Hosts asked for through the gateway, with the chart's egress proxy: a request to a host the
execution was not granted is refused by the proxy (403) and reported in the gateway's result,
and a host the tenant may not name ends the run InvalidSpec.

This module installs a release of its own, whose tenant may name ALLOWED only (the chart's
tenants[].egress.allowedHosts). Nothing leaves the machine: the proxy refuses other.example by
the execution's grant before any name lookup, and it has no DNS (the chart gives it none) and
no host aliases here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from chart_release import installed
from cluster_fixtures import ReleaseFactory
from kubernetes import client
from release_settings import narrowed_tenant
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
def tenant(
    new_release: ReleaseFactory,
    namespace_prefix: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> Iterator[httpx.Client]:
    """A tenant of a release of this module's own, whose namespace may name ALLOWED only."""
    prefix = f"{namespace_prefix}gx"
    namespace = f"{prefix}-tenant-{uuid.uuid4().hex[:4]}"
    create_namespace(core_v1, namespace)
    release = new_release(prefix, {"tenants": [narrowed_tenant(namespace, [ALLOWED])]})
    try:
        with installed(release):
            gateway = release.gateway()
            key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60)
            with gateway.client(key) as http:
                yield http
            # Executions carry the operator's finalizer: deleted while it runs.
            delete_executions(custom_objects, namespace, timeout=60)
    finally:
        core_v1.delete_namespace(namespace, propagation_policy="Background")


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
