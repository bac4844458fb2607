"""Pods on a real cluster, watched until they reach a state, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch

TERMINAL_POD_PHASES = {"Succeeded", "Failed"}


def wait_for_pod(
    core_v1: client.CoreV1Api,
    namespace: str,
    name: str,
    *,
    until: Callable[[client.V1Pod], bool],
    timeout: float,
    what: str,
) -> client.V1Pod:
    """Watches one pod until `until(pod)` holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    pod_watch = watch.Watch()
    while (remaining := deadline - time.monotonic()) > 0:
        pod = core_v1.read_namespaced_pod(name, namespace)
        if until(pod):
            return pod
        for event in pod_watch.stream(
            core_v1.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=pod.metadata.resource_version,
            timeout_seconds=max(1, int(remaining)),
        ):
            candidate: Any = event["object"]
            if until(candidate):
                pod_watch.stop()
                return candidate  # type: ignore[no-any-return]
    pytest.fail(f"timed out after {timeout}s waiting for pod {namespace}/{name}: {what}")


def pod_finished(pod: client.V1Pod) -> bool:
    return pod.status is not None and pod.status.phase in TERMINAL_POD_PHASES


def pod_running(pod: client.V1Pod) -> bool:
    return pod.status is not None and pod.status.phase == "Running" and bool(pod.status.pod_ip)


def resource_version_now(core_v1: client.CoreV1Api, namespace: str) -> str:
    """The namespace's pod list's resource version: watch from here to miss nothing after."""
    listed: Any = core_v1.list_namespaced_pod(namespace, limit=1)
    return str(listed.metadata.resource_version)


def wait_for_pod_matching(
    core_v1: client.CoreV1Api,
    namespace: str,
    label_selector: str,
    *,
    since: str,
    timeout: float,
    what: str,
) -> client.V1Pod:
    """Watches pods from resource version `since` until one matches `label_selector` (so a
    state that comes and goes between two polls is still seen)."""
    deadline = time.monotonic() + timeout
    pod_watch = watch.Watch()
    resource_version = since
    while (remaining := deadline - time.monotonic()) > 0:
        for event in pod_watch.stream(
            core_v1.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=max(1, int(remaining)),
        ):
            pod: Any = event["object"]
            resource_version = pod.metadata.resource_version
            if event["type"] in ("ADDED", "MODIFIED"):
                pod_watch.stop()
                return pod  # type: ignore[no-any-return]
    pytest.fail(f"timed out after {timeout}s waiting in {namespace} for {what}")


SANDBOX_UID = 65532  # the operator's default sandbox uid and gid (settings.sandbox_uid)


def hardened_pod(
    name: str,
    labels: dict[str, str],
    container: client.V1Container,
    *,
    volumes: list[client.V1Volume] | None = None,
    active_deadline_seconds: int | None = None,
) -> client.V1Pod:
    """A pod of one container hardened as the operator's sandbox pods are: gVisor, no
    service-account token or service links, the sandbox's non-root uid and gid, the runtime's
    default seccomp profile; the container read-only, with no capability and no privilege
    escalation."""
    container.security_context = client.V1SecurityContext(
        read_only_root_filesystem=True,
        allow_privilege_escalation=False,
        capabilities=client.V1Capabilities(drop=["ALL"]),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            runtime_class_name="gvisor",
            restart_policy="Never",
            automount_service_account_token=False,
            enable_service_links=False,
            termination_grace_period_seconds=0,
            active_deadline_seconds=active_deadline_seconds,
            security_context=client.V1PodSecurityContext(
                run_as_non_root=True,
                run_as_user=SANDBOX_UID,
                run_as_group=SANDBOX_UID,
                seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
            ),
            containers=[container],
            volumes=volumes,
        ),
    )
