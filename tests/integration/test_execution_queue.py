"""The executions queue with the operator (kopf) running against a real, private etcd +
kube-apiserver: a queued execution is left alone while its tenant runs as many as it may,
and let go in turn, then started as if just created. No scheduler or kubelet: the tenant's
running executions are records of the direct path (which the operator does not reconcile),
finished by labelling them as the operator would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from sandpod_contract.names import (
    FINISHED_LABEL,
    GROUP,
    PLURAL,
    QUEUED_LABEL,
    RECORD_DIRECT,
    RECORD_LABEL,
    TENANT_LABEL,
    VERSION,
)
from sandpod_testkit.components import OperatorProcess
from sandpod_testkit.paths import CRDS_DIR
from sandpod_testkit.waiting import wait_until
from test_gateway_kube_service import PrivateApiServer, api_server, namespace

__all__ = ["api_server", "namespace"]


@pytest.fixture(scope="module")
def objects(api_server: PrivateApiServer) -> client.CustomObjectsApi:
    api_server.kubectl("apply", "-f", str(CRDS_DIR))
    # The sandbox pods' RuntimeClass, which the API server checks as it admits them.
    api_server.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "gvisor"},
            "handler": "runsc",
        }
    )
    return client.CustomObjectsApi(config.new_client_from_config(str(api_server.kubeconfig)))


@pytest.fixture(scope="module")
def operator(
    api_server: PrivateApiServer, objects: client.CustomObjectsApi, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    log: Path = tmp_path_factory.mktemp("operator") / "operator.log"
    process = OperatorProcess(
        env={**os.environ, "KUBECONFIG": str(api_server.kubeconfig)},
        namespaces=["gw-*"],
        log_path=log,
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def execution(name: str, tenant: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CodeExecution",
        "metadata": {"name": name, "labels": {TENANT_LABEL: tenant, **labels}},
        "spec": {"language": "python", "source": "print(1)"},
    }


def queued_names(objects: client.CustomObjectsApi, namespace: str, tenant: str) -> list[str]:
    listed: Any = objects.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{TENANT_LABEL}={tenant},{QUEUED_LABEL}"
    )
    return sorted(item["metadata"]["name"] for item in listed["items"])


def test_a_queued_execution_waits_for_its_tenants_turn_then_starts(
    api_server: PrivateApiServer,
    operator: OperatorProcess,
    objects: client.CustomObjectsApi,
    namespace: str,
) -> None:
    # What a sandbox pod needs to be admitted (no controller manager makes the account).
    api_server.kubectl("create", "serviceaccount", "default", "-n", namespace)

    def create(body: dict[str, Any]) -> None:
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    for name in ("run-0", "run-1"):
        create(execution(name, "t1", **{RECORD_LABEL: RECORD_DIRECT}))
    for name in ("q-0", "q-1", "q-2"):
        create(execution(name, "t1", **{QUEUED_LABEL: "2"}))
    # Another tenant's queue has room: let go at once, whatever t1's backlog.
    create(execution("other", "t2", **{QUEUED_LABEL: "1"}))
    wait_until(
        lambda: not queued_names(objects, namespace, "t2"),
        timeout=60,
        what="the other tenant's execution to be let go",
    )
    assert queued_names(objects, namespace, "t1") == ["q-0", "q-1", "q-2"]

    objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "run-0",
        {"metadata": {"labels": {FINISHED_LABEL: "true"}}},
    )
    wait_until(
        lambda: queued_names(objects, namespace, "t1") == ["q-1", "q-2"],
        timeout=60,
        what="the oldest queued execution to be let go, and only it",
    )

    def status_of(name: str) -> Any:
        body: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return body.get("status")

    # Let go, it starts as if just created: its pod is created (no node takes it here, so it
    # stays Pending, and running).
    wait_until(lambda: status_of("q-0"), timeout=60, what="the operator to take up q-0")
    assert status_of("q-0")["phase"] == "Pending", status_of("q-0")
    assert status_of("q-1") is None
    assert queued_names(objects, namespace, "t1") == ["q-1", "q-2"]
