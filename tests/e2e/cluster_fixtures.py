"""Fixtures for tests that run against a real cluster (tests/e2e, tests/hostile), loaded once
per session as a plugin by tests/conftest.py, so every suite shares one operator.

The cluster is the local one (`make cluster-up`, kubeconfig in .cluster/) or any cluster that
KUBECONFIG points at. A missing cluster is an error, never a skip.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from executions import delete_executions
from gateway_process import Gateway, create_keys_secret
from kube_helpers import create_namespace, wait_until
from kubernetes import client, config
from operator_process import (
    MISSING_IMAGE,
    MISSING_IMAGE_LANGUAGE,
    MISSING_RUNTIME_CLASS,
    OperatorProcess,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture(scope="session")
def namespace_prefix() -> str:
    """Begins the name of every namespace this test session makes. The session's operator
    watches only these, so test sessions (and an operator installed by the chart) can share
    one cluster without reconciling each other's executions."""
    return f"e2e{uuid.uuid4().hex[:4]}"


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

CRD_PATH = REPO_ROOT / "crds" / "codeexecutions.sandpod.dev.yaml"


@pytest.fixture(scope="session")
def sandpod_crd(api_client: client.ApiClient) -> str:
    """Applies crds/ (create or replace) and waits until the API serves CodeExecutions."""
    manifest = yaml.safe_load(CRD_PATH.read_text())
    extensions = client.ApiextensionsV1Api(api_client)
    name = manifest["metadata"]["name"]
    try:
        extensions.create_custom_resource_definition(manifest)
    except client.ApiException as error:
        if error.status != 409:
            raise
        current: Any = extensions.read_custom_resource_definition(name)
        manifest["metadata"]["resourceVersion"] = current.metadata.resource_version
        extensions.replace_custom_resource_definition(name, manifest)

    def established() -> bool:
        crd: Any = extensions.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        return conditions.get("Established") == "True"

    wait_until(established, timeout=30, what=f"CRD {name} to be established")
    objects = client.CustomObjectsApi(api_client)

    def served() -> bool:
        try:
            objects.list_cluster_custom_object("sandpod.dev", "v1alpha1", "codeexecutions", limit=1)
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    wait_until(served, timeout=30, what=f"{name} to be served")
    return str(name)


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
    catalog = yaml.safe_load(
        (REPO_ROOT / "contract" / "sandpod_contract" / "catalog.yaml").read_text()
    )
    catalog["languages"][MISSING_IMAGE_LANGUAGE] = {
        "image": MISSING_IMAGE,
        "file": "main.sh",
        "command": ["sh", "main.sh"],
    }
    catalog_path = workdir / "catalog.yaml"
    catalog_path.write_text(yaml.safe_dump(catalog))
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig_path),
        "SANDPOD_CATALOG_PATH": str(catalog_path),
        "SANDPOD_ALLOWED_RUNTIME_CLASSES": json.dumps([MISSING_RUNTIME_CLASS]),
        "SANDPOD_MAX_MEMORY": "64Gi",
        "SANDPOD_UNSCHEDULABLE_GRACE_SECONDS": "2",
    }
    operator = OperatorProcess(env, workdir / "operator.log", [f"{namespace_prefix}-*"])
    operator.start()
    yield operator
    # Executions carry the operator's finalizer: before it stops, let it release those whose
    # namespace is going away (test namespaces are deleted in the background).
    objects = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        namespaces: list[Any] = core.list_namespace().items
        terminating = {ns.metadata.name for ns in namespaces if ns.status.phase == "Terminating"}
        listed: Any = objects.list_cluster_custom_object(
            "sandpod.dev", "v1alpha1", "codeexecutions"
        )
        if not any(
            item["metadata"].get("deletionTimestamp")
            or item["metadata"]["namespace"] in terminating
            for item in listed["items"]
        ):
            break
        time.sleep(0.5)
    operator.stop()


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
