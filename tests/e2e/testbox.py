"""Pods of the cluster's busybox test image (localhost/sandpod/testbox:1, imported by
`cluster-up`): create them, run shell in them, probe TCP from them."""

from __future__ import annotations

from typing import Any

from kube_helpers import pod_finished, pod_running, wait_for_pod
from kubernetes import client
from kubernetes.stream import stream

TESTBOX_IMAGE = "localhost/sandpod/testbox:1"


def busybox_pod(
    name: str,
    script: str,
    *,
    runtime_class: str | None = "gvisor",
    labels: dict[str, str] | None = None,
    memory_limit: str = "64Mi",
    memory_volume: bool = False,
) -> client.V1Pod:
    volume_mounts = [client.V1VolumeMount(name="memory", mount_path="/memory")]
    volumes = [
        client.V1Volume(name="memory", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory"))
    ]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1PodSpec(
            runtime_class_name=runtime_class,
            restart_policy="Never",
            automount_service_account_token=False,
            termination_grace_period_seconds=0,
            containers=[
                client.V1Container(
                    name="main",
                    image=TESTBOX_IMAGE,
                    image_pull_policy="Never",
                    command=["sh", "-c", script],
                    resources=client.V1ResourceRequirements(
                        limits={"memory": memory_limit, "cpu": "500m"},
                        requests={"memory": "16Mi", "cpu": "10m"},
                    ),
                    volume_mounts=volume_mounts if memory_volume else None,
                )
            ],
            volumes=volumes if memory_volume else None,
        ),
    )


def run_to_completion(core_v1: client.CoreV1Api, namespace: str, pod: client.V1Pod) -> client.V1Pod:
    core_v1.create_namespaced_pod(namespace, pod)
    return wait_for_pod(
        core_v1, namespace, pod.metadata.name, until=pod_finished, timeout=90, what="to finish"
    )


def start_and_wait_running(
    core_v1: client.CoreV1Api, namespace: str, pod: client.V1Pod
) -> client.V1Pod:
    core_v1.create_namespaced_pod(namespace, pod)
    return wait_for_pod(
        core_v1, namespace, pod.metadata.name, until=pod_running, timeout=90, what="to run"
    )


def exec_shell(core_v1: client.CoreV1Api, namespace: str, pod: str, script: str) -> str:
    output: Any = stream(
        core_v1.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=["sh", "-c", script],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    return str(output)


def tcp_reachable(core_v1: client.CoreV1Api, namespace: str, pod: str, ip: str, port: int) -> bool:
    script = (
        f"if echo | timeout 5 nc -w 3 {ip} {port} >/dev/null 2>&1; "
        "then echo open; else echo closed; fi"
    )
    return exec_shell(core_v1, namespace, pod, script).strip().endswith("open")
