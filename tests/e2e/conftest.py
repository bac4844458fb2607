"""Shared fixtures for tests that run against a real cluster.

The cluster is the local one (`make cluster-up`, kubeconfig in .cluster/) or any cluster that
KUBECONFIG points at. A missing cluster is an error, never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_helpers import wait_until
from kubernetes import client, config

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def kubeconfig_path() -> Path:
    path = Path(os.environ.get("KUBECONFIG") or REPO_ROOT / ".cluster" / "kubeconfig")
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


@pytest.fixture
def namespace(core_v1: client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for it to go)."""
    prefix = request.node.name.lower().replace("_", "-")
    prefix = "".join(c for c in prefix if c.isalnum() or c == "-")[:40].strip("-")
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_until(
        lambda: _default_service_account_exists(core_v1, name),
        timeout=30,
        what=f"the default service account in {name}",
    )
    yield name
    core_v1.delete_namespace(name, propagation_policy="Background", grace_period_seconds=0)


def _default_service_account_exists(core_v1: client.CoreV1Api, namespace: str) -> bool:
    try:
        core_v1.read_namespaced_service_account("default", namespace)
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True
