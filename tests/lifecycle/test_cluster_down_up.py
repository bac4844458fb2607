"""`cluster-down` leaves nothing behind, and `cluster-up` works again afterwards.

Runs last in `make test` (after every test that needs the cluster), and leaves the cluster up.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = Path(os.environ.get("SANDPOD_CLUSTER_DIR", REPO_ROOT / ".cluster"))
CACHE_DIR = Path(
    os.environ.get(
        "SANDPOD_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandpod"
    )
)
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


@pytest.mark.cluster
def test_cluster_down_stops_everything_and_up_works_again() -> None:
    run_script("down.sh")

    assert cluster_processes() == []
    assert not Path("/sys/class/net/cni0").exists()
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    assert [m for m in mounts if str(STATE_DIR) in m or "/run/sandpod" in m] == []
    assert iptables_chains() == []

    run_script("up.sh")
    assert cluster_processes() != []
