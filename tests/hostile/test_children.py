"""Children are adopted only when they are ours: an object that already has a child's
deterministic name but not this execution's ownerReference ends the execution with
Error/ChildConflict and is never used, changed or deleted.

The child's name depends on the execution's uid, so the object is planted while the
session's operator pod is paused (the node's cgroup freezer, then thawed): between the
execution's creation and its first reconciliation, as a user racing the operator would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from chart_release import Deployed
from executions import create
from kubernetes import client
from results_table import Row
from sandpod_contract.names import child_name
from testbox import busybox_pod
from tracker import ClusterTracker

PLANTED_LABEL = {"sp-hostile/planted": "yes"}


def plant_configmap(api: client.ApiClient, namespace: str, name: str) -> Any:
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=PLANTED_LABEL),
        data={"config.json": '{"mode": "run", "command": ["sh", "-c", "echo planted"]}'},
    )
    return client.CoreV1Api(api).create_namespaced_config_map(namespace, body)


def plant_pod(api: client.ApiClient, namespace: str, name: str) -> Any:
    pod = busybox_pod(name, "exec sleep 3600", labels=PLANTED_LABEL)
    return client.CoreV1Api(api).create_namespaced_pod(namespace, pod)


def plant_network_policy(api: client.ApiClient, namespace: str, name: str) -> Any:
    body = client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name=name, labels=PLANTED_LABEL),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(),
            policy_types=["Egress"],
            egress=[client.V1NetworkPolicyEgressRule()],  # everything
        ),
    )
    return client.NetworkingV1Api(api).create_namespaced_network_policy(namespace, body)


def read_planted(api: client.ApiClient, kind: str, namespace: str, name: str) -> Any:
    if kind == "ConfigMap":
        return client.CoreV1Api(api).read_namespaced_config_map(name, namespace)
    if kind == "Pod":
        return client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    return client.NetworkingV1Api(api).read_namespaced_network_policy(name, namespace)


PLANTERS: dict[str, Callable[[client.ApiClient, str, str], Any]] = {
    "ConfigMap": plant_configmap,
    "Pod": plant_pod,
    "NetworkPolicy": plant_network_policy,
}


@pytest.mark.parametrize("kind", list(PLANTERS))
def test_a_child_name_taken_by_someone_else_ends_the_execution(
    kind: str,
    sandpod_operator: Deployed,
    api_client: client.ApiClient,
    custom_objects: client.CustomObjectsApi,
    hostile_namespace: str,
    tracker: ClusterTracker,
    table_row: Row,
) -> None:
    table_row.expected = "Error/ChildConflict, the planted object untouched"
    spec: dict[str, Any] = {"language": "python", "source": "print('ran')"}
    if kind == "NetworkPolicy":
        spec["network"] = {"egress": "allowlist", "allow": [{"cidr": "203.0.113.0/24"}]}
    with sandpod_operator.paused():
        created = create(custom_objects, hostile_namespace, "hostile", **spec)
        name = child_name("hostile", created["metadata"]["uid"])
        planted = PLANTERS[kind](api_client, hostile_namespace, name)
    key = (hostile_namespace, "hostile")
    tracker.wait_terminal([key], timeout=120)
    status = tracker.status(key)
    table_row.observed = f"{status.get('phase')}/{status.get('reason')}"
    assert (status.get("phase"), status.get("reason"), status.get("retryable")) == (
        "Error",
        "ChildConflict",
        False,
    ), status
    assert name in status["message"] and "podName" not in status
    now = read_planted(api_client, kind, hostile_namespace, name)
    assert now.metadata.uid == planted.metadata.uid
    assert now.metadata.resource_version == planted.metadata.resource_version or kind == "Pod"
    assert not now.metadata.deletion_timestamp
    assert not tracker.pods_of(key)  # the sandbox never ran
