"""The local cluster itself: API server, node, gVisor, NetworkPolicy, OOM kills, garbage collection.

These pods use the busybox test image that `cluster-up` builds and imports
(localhost/sandpod/testbox:1), so they depend on nothing else in the project.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubernetes import client
from sandpod_testkit.kube import is_gone
from sandpod_testkit.waiting import wait_until
from testbox import (
    busybox_pod,
    exec_shell,
    run_to_completion,
    start_and_wait_running,
    tcp_reachable,
)

SERVER_PORT = 8080
KUBERNETES_SERVICE = ("10.96.0.1", 443)
DNS_SERVICE_IP = "10.96.0.10"


def dns_resolves(core_v1: client.CoreV1Api, namespace: str, pod: str, name: str) -> bool:
    script = (
        f"if timeout 8 nslookup {name} {DNS_SERVICE_IP} >/dev/null 2>&1; "
        "then echo resolved; else echo failed; fi"
    )
    return exec_shell(core_v1, namespace, pod, script).strip().endswith("resolved")


def deny_all_policy(policy_types: list[str]) -> client.V1NetworkPolicy:
    return client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name="deny-all-" + "-".join(t.lower() for t in policy_types)),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(), policy_types=policy_types
        ),
    )


def test_api_server_is_ready_and_node_is_ready(core_v1: client.CoreV1Api) -> None:
    api = core_v1.api_client
    readyz = api.rest_client.pool_manager.request("GET", f"{api.configuration.host}/readyz")
    assert (readyz.status, readyz.data) == (200, b"ok")
    nodes = core_v1.list_node().items
    assert len(nodes) >= 1
    for node in nodes:
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True", f"node {node.metadata.name} is not Ready: {ready.message}"


def test_gvisor_pod_runs_under_the_gvisor_kernel(core_v1: client.CoreV1Api, namespace: str) -> None:
    pod = run_to_completion(
        core_v1,
        namespace,
        busybox_pod("kernel", "cat /proc/version; dmesg"),
    )
    assert pod.status.phase == "Succeeded"
    logs = core_v1.read_namespaced_pod_log("kernel", namespace)
    host_kernel = Path("/proc/version").read_text().strip()
    assert host_kernel not in logs
    assert "Starting gVisor" in logs


def test_network_policy_is_enforced_between_pods(core_v1: client.CoreV1Api, namespace: str) -> None:
    networking = client.NetworkingV1Api(core_v1.api_client)
    server = start_and_wait_running(
        core_v1,
        namespace,
        busybox_pod(
            "server",
            "mkdir -p /tmp/www && echo pong > /tmp/www/index.html && "
            f"httpd -f -p {SERVER_PORT} -h /tmp/www",
            labels={"app": "server"},
        ),
    )
    start_and_wait_running(core_v1, namespace, busybox_pod("client", "sleep 3600"))
    server_ip = server.status.pod_ip

    wait_until(
        lambda: tcp_reachable(core_v1, namespace, "client", server_ip, SERVER_PORT),
        timeout=30,
        what="the client to reach the server before any policy",
    )
    # busybox's static wget cannot resolve names without NSS; speak HTTP through nc instead.
    fetched = exec_shell(
        core_v1,
        namespace,
        "client",
        f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 3 {server_ip} {SERVER_PORT}",
    )
    assert fetched.strip().endswith("pong")

    networking.create_namespaced_network_policy(namespace, deny_all_policy(["Ingress", "Egress"]))
    wait_until(
        lambda: not tcp_reachable(core_v1, namespace, "client", server_ip, SERVER_PORT),
        timeout=30,
        what="the deny-all policy to cut the client off the server",
    )


def test_deny_all_egress_blocks_dns_and_the_api_server(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    networking = client.NetworkingV1Api(core_v1.api_client)
    start_and_wait_running(core_v1, namespace, busybox_pod("probe", "sleep 3600"))
    api_ip, api_port = KUBERNETES_SERVICE

    # Without a policy, both work: so what the policy blocks below is the policy's doing.
    assert dns_resolves(core_v1, namespace, "probe", "kubernetes.default.svc.cluster.local")
    assert tcp_reachable(core_v1, namespace, "probe", api_ip, api_port)

    networking.create_namespaced_network_policy(namespace, deny_all_policy(["Egress"]))
    wait_until(
        lambda: not tcp_reachable(core_v1, namespace, "probe", api_ip, api_port),
        timeout=30,
        what="the deny-all egress policy to block the API server",
    )
    assert not dns_resolves(core_v1, namespace, "probe", "kubernetes.default.svc.cluster.local")

    # A pod started after the policy exists is blocked from its first packet.
    start_and_wait_running(core_v1, namespace, busybox_pod("late", "sleep 3600"))
    assert not tcp_reachable(core_v1, namespace, "late", api_ip, api_port)


@pytest.mark.parametrize("runtime_class", ["gvisor", None], ids=["gvisor", "runc"])
def test_pod_over_its_memory_limit_is_oom_killed(
    core_v1: client.CoreV1Api, namespace: str, runtime_class: str | None
) -> None:
    pod = run_to_completion(
        core_v1,
        namespace,
        busybox_pod(
            "memory-hog",
            "dd if=/dev/zero of=/memory/fill bs=1M count=256; sleep 1",
            runtime_class=runtime_class,
            memory_limit="64Mi",
            memory_volume=True,
        ),
    )
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated is not None
    assert terminated.reason == "OOMKilled"


def test_deleting_an_owner_deletes_its_owned_child(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    owner = core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    child_name = f"child-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=child_name,
                owner_references=[
                    client.V1OwnerReference(
                        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
                    )
                ],
            )
        ),
    )
    core_v1.delete_namespaced_config_map("owner", namespace)

    wait_until(
        lambda: is_gone(lambda: core_v1.read_namespaced_config_map(child_name, namespace)),
        timeout=60,
        what="garbage collection of the owned ConfigMap",
    )
