"""SandboxPools on the cluster: a pool fills, and refills when one of its pods is claimed.

Pool pods run the real runner in serve mode (`sandpod-runner --serve`); a pod is ready when the
kubelet's probe of its runner port answers, i.e. its program's process is pre-started.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_release import Deployed, DeployedGateway
from executions import RECORD_TIMEOUT, kubectl, wait_for
from kubernetes import client
from pool_helpers import FILL_TIMEOUT, fresh_pool_namespace, pods_in_state, pool_counts, start_pool
from sandpod_contract.names import (
    CLAIMED_BY_LABEL,
    EXECUTION_LABEL,
    POOL_STATE_LABEL,
    RECORD_DIRECT,
    RECORD_LABEL,
)
from sandpod_testkit.kube import is_gone
from sandpod_testkit.waiting import wait_until


@pytest.fixture
def pool_namespace(
    sandpod_operator: Deployed,
    namespace_prefix: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> Iterator[str]:
    """A fresh namespace per test, which the session's release serves."""
    with fresh_pool_namespace(f"{namespace_prefix}-pool", core_v1, custom_objects) as name:
        yield name


def claim(core: client.CoreV1Api, pod: Any) -> None:
    """What an execution's claim does: one patch, at the pod's resourceVersion, that marks it
    claimed and moves its ownership away from the pool."""
    patch = {
        "metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "labels": {
                POOL_STATE_LABEL: "claimed",
                CLAIMED_BY_LABEL: "by-hand",
                EXECUTION_LABEL: "by-hand",
            },
            "ownerReferences": None,
        }
    }
    core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, patch)


def test_a_pool_fills_and_refills_after_a_claim(
    pool_namespace: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    kubeconfig_path: Path,
) -> None:
    start_pool(custom_objects, pool_namespace, 2)
    shown = kubectl(kubeconfig_path, "get", "sbp", "py", "-n", pool_namespace, "--no-headers")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:5] == ["py", "python", "2", "2", "2"]

    claimed = pods_in_state(core_v1, pool_namespace, "py", "free")[0]
    claim(core_v1, claimed)
    wait_until(
        lambda: (
            len(pods_in_state(core_v1, pool_namespace, "py", "free")) == 2
            and pool_counts(custom_objects, pool_namespace, "py") == (2, 2)
        ),
        timeout=FILL_TIMEOUT,
        what="the pool to refill to 2 ready pods",
        interval=0.5,
    )
    # The claimed pod is the claimer's now: the pool neither counts nor removes it.
    free = {pod.metadata.name for pod in pods_in_state(core_v1, pool_namespace, "py", "free")}
    assert claimed.metadata.name not in free
    assert not is_gone(lambda: core_v1.read_namespaced_pod(claimed.metadata.name, pool_namespace))
    core_v1.delete_namespaced_pod(claimed.metadata.name, pool_namespace, grace_period_seconds=0)


def test_a_waiting_run_through_the_gateway_takes_a_pool_pod_directly(
    pool_namespace: str,
    gateway: DeployedGateway,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    """The direct path: the run is answered by a ready pool pod's runner, its record (labelled
    direct, warm) written behind, the pod removed and the pool refilled."""
    start_pool(custom_objects, pool_namespace, 1)
    [free] = pods_in_state(core_v1, pool_namespace, "py", "free")
    key = gateway.add_tenant(pool_namespace, pool_namespace)

    with gateway.client(key) as http:
        response = http.post("/v1/executions", json={"language": "python", "code": "print(6*7)"})

    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["status"], answer["stdout"]) == ("success", "42\n"), answer
    record = wait_for(custom_objects, pool_namespace, answer["id"], timeout=RECORD_TIMEOUT)
    labels, status = record["metadata"]["labels"], record["status"]
    assert labels[RECORD_LABEL] == RECORD_DIRECT
    assert (status["startMode"], status["podName"]) == ("warm", free.metadata.name)
    wait_until(
        lambda: is_gone(lambda: core_v1.read_namespaced_pod(free.metadata.name, pool_namespace)),
        timeout=60,
        what="the used pool pod to be removed",
    )
    wait_until(
        lambda: pool_counts(custom_objects, pool_namespace, "py") == (1, 1),
        timeout=FILL_TIMEOUT,
        what="the pool to refill",
        interval=0.5,
    )
