"""`cluster-down` leaves nothing behind, and `cluster-up` works again afterwards, whatever other
tools did to /run/netns meanwhile.

Runs last in `make test` (after every test that needs the cluster), and leaves the cluster up.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from sandpod_testkit.kube import create_namespace
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.waiting import wait_until
from testbox import busybox_pod, start_and_wait_running

STATE_DIR = Path(os.environ.get("SANDPOD_CLUSTER_DIR", REPO_ROOT / ".cluster"))
CACHE_DIR = Path(
    os.environ.get(
        "SANDPOD_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandpod"
    )
)
GATEWAY_FORWARD_TARGET = STATE_DIR / "gateway-forward-target"
GATEWAY_READYZ = "http://127.0.0.1:8080/readyz"
OTHER_TOOLS_NETNS = "sandpod-lifecycle-other-tool"
CLUSTER_CGROUPS = [
    Path("/sys/fs/cgroup/pids/sandpod-cluster"),
    Path("/sys/fs/cgroup/pids/kubepods"),
]


def run_script(name: str) -> None:
    completed = subprocess.run(
        [str(REPO_ROOT / "hack" / "cluster" / name)], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stderr[-4000:]


def cluster_processes() -> list[str]:
    """Every live process that belongs to the cluster: by cgroup, executable or command line."""
    found = set()
    for cgroup in CLUSTER_CGROUPS:
        for procs in cgroup.rglob("cgroup.procs") if cgroup.exists() else []:
            found.update(procs.read_text().split())
    markers = (str(CACHE_DIR / "bin"), str(STATE_DIR))
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            executable = os.readlink(proc / "exe")
            command_line = (
                (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            continue
        if any(executable.startswith(m) or m in command_line for m in markers):
            found.add(proc.name)
    descriptions = []
    for pid in sorted(found):
        try:
            command = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        descriptions.append(f"{pid}: {command[:200]}")
    return descriptions


def iptables_chains() -> list[str]:
    chains = []
    for table in ("filter", "nat"):
        rules = subprocess.run(
            ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True
        ).stdout
        chains += [
            line.split()[1]
            for line in rules.splitlines()
            if line.startswith("-N ") and line.split()[1].startswith(("KUBE-", "CNI-", "SANDPOD-"))
        ]
    return chains


def nsfs_mounts() -> list[str]:
    """Mount points of network namespaces (containerd's pod netns, `ip netns add`'s)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return [line.split()[1] for line in mounts if line.split()[2] == "nsfs"]


def gateway_answers() -> bool:
    try:
        with urllib.request.urlopen(GATEWAY_READYZ, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_sandbox_pod(core_v1: client.CoreV1Api, namespace: str) -> None:
    start_and_wait_running(core_v1, namespace, busybox_pod("sleeper", "sleep 3600"))


@pytest.fixture
def other_tools_netns() -> Iterator[str]:
    """A network namespace of another tool (the hostile suite's fake hosts, any `ip netns add`),
    removed after the test; the first one turns /run/netns into a shared bind mount of itself."""
    yield OTHER_TOOLS_NETNS
    subprocess.run(["ip", "netns", "del", OTHER_TOOLS_NETNS], check=False)


@pytest.mark.cluster
def test_cluster_down_stops_everything_and_up_works_again(
    core_v1: client.CoreV1Api, other_tools_netns: str
) -> None:
    namespaces = [f"lifecycle-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    create_namespace(core_v1, namespaces[0])
    start_sandbox_pod(core_v1, namespaces[0])
    pod_netns = [m for m in nsfs_mounts() if "/cni-" in m]
    assert pod_netns, "a running pod has a network namespace"
    assert not [m for m in pod_netns if m.startswith("/run/netns/")], pod_netns
    # Pods exist, then another tool adds a namespace: down must still remove every pod's one.
    subprocess.run(["ip", "netns", "add", other_tools_netns], check=True)

    run_script("down.sh")

    assert cluster_processes() == []
    assert not Path("/sys/class/net/cni0").exists()
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    assert [m for m in mounts if str(STATE_DIR) in m or "/run/sandpod" in m] == []
    assert [m for m in nsfs_mounts() if "/cni-" in m] == []
    assert f"/run/netns/{other_tools_netns}" in nsfs_mounts(), "another tool's netns is kept"
    assert iptables_chains() == []

    run_script("up.sh")
    assert cluster_processes() != []
    create_namespace(core_v1, namespaces[1])
    start_sandbox_pod(core_v1, namespaces[1])
    if GATEWAY_FORWARD_TARGET.exists():  # `make run` served the gateway: `up` serves it again
        wait_until(gateway_answers, timeout=120, what="the gateway on 127.0.0.1:8080")
    for namespace in namespaces:
        core_v1.delete_namespace(namespace)
