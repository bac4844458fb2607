"""The hostile suite: fixtures (fake remote hosts, a peer pod, a cluster watcher) and the
results table printed at the end of the session (case, expected, observed, PASS/FAIL).

Cluster fixtures (namespaces, the CRD, the operator) come from tests/e2e/cluster_fixtures.py.
"""

from __future__ import annotations

import platform
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hosts import LISTEN_PORT, METADATA_ADDRESS, PUBLIC_ADDRESS, FakeHosts, NetworkControl
from kubernetes import client
from results_table import (  # noqa: F401 - pytest hooks and fixture
    pytest_runtest_makereport,
    pytest_terminal_summary,
    table_row,
)
from sandpod_testkit.kube import LOCAL_POD_CIDR, create_namespace, delete_executions
from testbox import busybox_pod, exec_shell, start_and_wait_running, tcp_reachable
from tracker import ClusterTracker

PEER_PORT = 8080


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.cluster)


# --- the cluster, watched -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def hostile_prefix(namespace_prefix: str) -> str:
    """Begins every namespace this suite makes (the session's operator watches them)."""
    return f"{namespace_prefix}-hx"


@pytest.fixture(scope="session")
def tracker(api_client: client.ApiClient, hostile_prefix: str) -> Iterator[ClusterTracker]:
    with ClusterTracker(api_client, hostile_prefix) as watching:
        yield watching


@pytest.fixture
def hostile_namespace(
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    hostile_prefix: str,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """A fresh namespace for one test, watched by the tracker; deleted afterwards."""
    test_name = "".join(c for c in request.node.name.lower() if c.isalnum())[:30]
    name = f"{hostile_prefix}-{test_name}-{uuid.uuid4().hex[:4]}"
    create_namespace(core_v1, name)
    yield name
    delete_executions(custom_objects, name, timeout=120)
    core_v1.delete_namespace(name, propagation_policy="Background")


# --- fake remote hosts and a peer pod, with proof that they are reachable without policy ---------


@pytest.fixture(scope="session")
def fake_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    hosts = FakeHosts(LOCAL_POD_CIDR, tmp_path_factory.mktemp("fake-hosts") / "connections.log")
    try:
        hosts.create()
        yield hosts
    finally:
        hosts.remove()
    assert not hosts.leftovers(), f"the fake hosts left {hosts.leftovers()} on the host"


@pytest.fixture(scope="session")
def network_control(
    core_v1: client.CoreV1Api, hostile_prefix: str, fake_hosts: FakeHosts
) -> Iterator[NetworkControl]:
    """A peer pod serving on PEER_PORT and a control pod, in a namespace without policies;
    the control pod connects to the peer and to the fake hosts."""
    namespace = f"{hostile_prefix}-peers-{uuid.uuid4().hex[:4]}"
    create_namespace(core_v1, namespace)
    try:
        peer_script = (
            f"mkdir -p /tmp/www && echo peer > /tmp/www/index.html && "
            f"exec httpd -f -p {PEER_PORT} -h /tmp/www"
        )
        peer = start_and_wait_running(core_v1, namespace, busybox_pod("peer", peer_script))
        control = start_and_wait_running(
            core_v1, namespace, busybox_pod("control", "exec sleep 3600")
        )
        assert fake_hosts.routed_here(), "pod traffic to the fake hosts would leave the machine"
        targets = {
            f"{peer.status.pod_ip}:{PEER_PORT}": (peer.status.pod_ip, PEER_PORT),
            f"{PUBLIC_ADDRESS}:{LISTEN_PORT}": (PUBLIC_ADDRESS, LISTEN_PORT),
            f"{METADATA_ADDRESS}:{LISTEN_PORT}": (METADATA_ADDRESS, LISTEN_PORT),
        }
        reached = {
            name: tcp_reachable(core_v1, namespace, control.metadata.name, ip, port)
            for name, (ip, port) in targets.items()
        }
        answer = exec_shell(
            core_v1, namespace, "control", f"echo | nc -w 3 {PUBLIC_ADDRESS} {LISTEN_PORT}"
        )
        reached["fake host answers"] = f"sp-hostile-fake {PUBLIC_ADDRESS}" in answer
        yield NetworkControl(
            peer_ip=str(peer.status.pod_ip),
            reached=reached,
        )
    finally:
        core_v1.delete_namespace(namespace, propagation_policy="Background", grace_period_seconds=0)


@pytest.fixture(scope="session")
def cluster_facts(node_ip: str, network_control: NetworkControl) -> dict[str, str]:
    """Values the corpus's arguments refer to ({node_ip}, {peer_ip}, ...)."""
    return {
        "node_ip": node_ip,
        "peer_ip": network_control.peer_ip,
        "peer_port": str(PEER_PORT),
        "public_ip": PUBLIC_ADDRESS,
        "metadata_ip": METADATA_ADDRESS,
        "fake_port": str(LISTEN_PORT),
        "host_kernel": platform.release(),
    }
