"""Fixtures for tests that run against a real cluster (tests/e2e, tests/hostile), loaded once
per session as a plugin by tests/conftest.py, so every suite shares one operator.

The cluster is the local one (`make cluster-up`, kubeconfig in .cluster/) or any cluster that
KUBECONFIG points at. A missing cluster is an error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_process import Gateway, create_keys_secret
from kubernetes import client, config
from operator_process import e2e_operator
from sandpod_testkit.components import OperatorProcess
from sandpod_testkit.kube import (
    GROUP,
    PLURAL,
    VERSION,
    cluster_ranges,
    create_namespace,
    delete_executions,
    ensure_crd,
)
from sandpod_testkit.paths import default_kubeconfig
from sandpod_testkit.waiting import WaitTimeout, wait_until


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
    """Begins the name of every namespace this test session makes. The session's operator
    watches only these, so test sessions (and an operator installed by the chart) can share
    one cluster without reconciling each other's executions."""
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


# --- sandpod's CRD and a locally running operator (tests/e2e/test_operator.py and others) ---


@pytest.fixture(scope="session")
def sandpod_crd(api_client: client.ApiClient) -> str:
    """Applies crds/ (create or replace) and waits until the API serves CodeExecutions."""
    return ensure_crd(api_client)


@pytest.fixture(scope="session")
def sandpod_operator(
    sandpod_crd: str,
    namespace_prefix: str,
    api_client: client.ApiClient,
    kubeconfig_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The operator, running on this machine against the test cluster, for the whole session."""
    workdir = tmp_path_factory.mktemp("operator")
    operator = e2e_operator(
        kubeconfig_path, [f"{namespace_prefix}-*"], workdir, cluster_ranges(api_client)
    )
    operator.start()
    yield operator
    # Executions carry the operator's finalizer: before it stops, let it release those whose
    # namespace is going away (test namespaces are deleted in the background).
    with contextlib.suppress(WaitTimeout):  # stop it anyway; the namespaces then stay
        wait_until(
            lambda: not executions_being_released(api_client),
            timeout=60,
            what="the operator to release the executions",
            interval=0.5,
        )
    operator.stop()


def executions_being_released(api_client: client.ApiClient) -> bool:
    """Whether an execution is being deleted or lives in a namespace that is going away."""
    namespaces: list[Any] = client.CoreV1Api(api_client).list_namespace().items
    terminating = {ns.metadata.name for ns in namespaces if ns.status.phase == "Terminating"}
    listed: Any = client.CustomObjectsApi(api_client).list_cluster_custom_object(
        GROUP, VERSION, PLURAL
    )
    return any(
        item["metadata"].get("deletionTimestamp") or item["metadata"]["namespace"] in terminating
        for item in listed["items"]
    )


@pytest.fixture(scope="session")
def gateway(
    sandpod_operator: OperatorProcess,
    namespace_prefix: str,
    kubeconfig_path: Path,
    core_v1: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    """The gateway, running on this machine against the test cluster, for the whole session,
    with its keys Secret in a namespace of its own (tests add tenants with `add_tenant`)."""
    keys_namespace = f"{namespace_prefix}-gateway-keys-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=keys_namespace)))
    create_keys_secret(core_v1, keys_namespace)
    gateway = Gateway(
        kubeconfig_path, keys_namespace, core_v1, tmp_path_factory.mktemp("gateway") / "gateway.log"
    )
    try:
        gateway.start()
        yield gateway
    finally:
        gateway.stop()
        core_v1.delete_namespace(keys_namespace, propagation_policy="Background")
