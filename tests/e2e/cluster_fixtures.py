"""Fixtures for tests that run against a real cluster (tests/e2e, tests/hostile), loaded once
per session as a plugin by tests/conftest.py, so every suite shares one release of the chart
(its operator, gateway and egress proxy as Deployments, chart_release.py).

The cluster is the local one (`make cluster-up`, kubeconfig in .cluster/) or any cluster that
KUBECONFIG points at. A missing cluster is an error, never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_release import ChartRelease, Deployed, DeployedGateway, installed, merged
from kubernetes import client, config
from release_settings import platform_values, session_values
from sandpod_testkit.kube import create_namespace, delete_executions, ensure_crd
from sandpod_testkit.paths import default_kubeconfig


@pytest.fixture(scope="session")
def kubeconfig_path() -> Path:
    path = default_kubeconfig()
    if not path.is_file():
        pytest.fail(f"no cluster: {path} does not exist (run `make cluster-up` or set KUBECONFIG)")
    return path


@pytest.fixture(scope="session")
def api_client(kubeconfig_path: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig_path))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom_objects(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture(scope="session")
def namespace_prefix() -> str:
    """Begins the name of every namespace this test session makes. The session's release
    serves only these, so test sessions (and `make run`'s release) can share one cluster
    without reconciling each other's executions."""
    return f"{os.environ.get('E2E_NAMESPACE_PREFIX', 'e2e')}{uuid.uuid4().hex[:4]}"


@pytest.fixture(scope="session")
def node_ip(core_v1: client.CoreV1Api) -> str:
    """The (first) node's address: this machine, as pods see it."""
    node: Any = core_v1.list_node().items[0]
    return str(next(a.address for a in node.status.addresses if a.type == "InternalIP"))


@pytest.fixture
def namespace(
    core_v1: client.CoreV1Api, namespace_prefix: str, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (its executions first: see
    delete_executions; the namespace itself without waiting for it to go)."""
    test_name = request.node.name.lower().replace("_", "-")
    room = min(40, 63 - len(namespace_prefix) - 8)  # a namespace name is a DNS label
    test_name = "".join(c for c in test_name if c.isalnum() or c == "-")[:room].strip("-")
    name = f"{namespace_prefix}-{test_name}-{uuid.uuid4().hex[:6]}"
    create_namespace(core_v1, name)
    yield name
    try:
        delete_executions(client.CustomObjectsApi(core_v1.api_client), name, timeout=60)
    except client.ApiException as error:
        if error.status != 404:  # 404: the CRD is not installed, so there are none
            raise
    core_v1.delete_namespace(name, propagation_policy="Background", grace_period_seconds=0)


# --- sandpod's CRD and the chart's release for the session ---------------------------------------


@pytest.fixture(scope="session")
def sandpod_crd(api_client: client.ApiClient) -> str:
    """Applies crds/ (create or replace) and waits until the API serves CodeExecutions."""
    return ensure_crd(api_client)


ReleaseFactory = Callable[[str, dict[str, Any]], ChartRelease]


@pytest.fixture(scope="session")
def new_release(
    sandpod_crd: str,
    helm: Path,
    kubeconfig_path: Path,
    api_client: client.ApiClient,
    node_ip: str,
    namespace_prefix: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> ReleaseFactory:
    """Makes (does not install) a release of the chart with the platform's settings
    (release_settings.py) and `values` over them: release `sp<prefix>` in namespace
    `sandpod-<prefix>`, serving the namespaces `<prefix>-*`."""

    def release(prefix: str, values: dict[str, Any]) -> ChartRelease:
        return ChartRelease(
            helm=helm,
            kubeconfig=kubeconfig_path,
            api_client=api_client,
            name=f"sp{prefix}",
            namespace=f"sandpod-{prefix}",
            values=merged(
                merged(platform_values(api_client, node_ip), session_values(f"{prefix}-*")),
                values,
            ),
            workdir=tmp_path_factory.mktemp(f"release-{prefix}"),
        )

    return release


@pytest.fixture(scope="session")
def sandpod_release(new_release: ReleaseFactory, namespace_prefix: str) -> Iterator[ChartRelease]:
    """The chart installed for the whole session, serving every namespace the session makes
    (`<namespace_prefix>-*`); uninstalled at the end (its hook releases the executions)."""
    with installed(new_release(namespace_prefix, {})) as release:
        yield release


@pytest.fixture(scope="session")
def sandpod_operator(sandpod_release: ChartRelease) -> Deployed:
    """The session release's operator (a Deployment of one pod)."""
    return sandpod_release.component("operator")


@pytest.fixture(scope="session")
def gateway(sandpod_release: ChartRelease) -> DeployedGateway:
    """The session release's gateway; tests add tenants with `add_tenant`."""
    gateway = sandpod_release.gateway()
    gateway.wait_ready()
    return gateway


@pytest.fixture
def operator_running(sandpod_operator: Deployed) -> Iterator[Deployed]:
    """The session's operator for a test that stops or kills it: running again after."""
    try:
        yield sandpod_operator
    finally:
        if not sandpod_operator.ready():
            sandpod_operator.start()
