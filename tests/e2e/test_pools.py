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
    direct, warm) written behind; a pool of a pod per run removes the pod and refills."""
    start_pool(custom_objects, pool_namespace, 1, runsPerSandbox=1)
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


# A run that leaves what it can for the next run of the same tenant in the same sandbox:
# files in every writable place, a user-site module and shell rc files in its home, a unix
# socket, a held lock, a detached process, 64 MiB in /tmp.
LEAVE_EVERYTHING = """
import fcntl, os, site, socket, subprocess
open("left.txt", "w").write("x")
open("/tmp/stray", "w").write("x")
open("/dev/shm/shared", "w").write("x")
open(os.path.expanduser("~/.bashrc"), "w").write("echo poisoned\\n")
os.makedirs(site.getusersitepackages(), exist_ok=True)
open(os.path.join(site.getusersitepackages(), "usercustomize.py"), "w").write("print(1)\\n")
listener = socket.socket(socket.AF_UNIX)
listener.bind("/tmp/listening.sock")
lock = open("/tmp/held.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
subprocess.Popen(["sh", "-c", "exec -a left-behind sleep 3600"], start_new_session=True)
with open("/tmp/fill", "wb") as fill:
    for _ in range(64):
        fill.write(b"x" * (1 << 20))
print("left", os.getpid())
"""

FIND_LEFTOVERS = """
import os
def cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""
seen = sorted(os.listdir(".")) + sorted(os.listdir("/tmp")) + sorted(os.listdir("/dev/shm"))
home = sorted(os.listdir(os.path.expanduser("~")))
left = [p for p in os.listdir("/proc") if p.isdigit() and b"left-behind" in cmdline(p)]
print(seen, home, left)
"""


# A run that reaches for the other processes of its sandbox: the runner and the next run's
# waiting interpreter. It may see them; it may not read, trace or enter them.
PEEK_AT_THE_OTHERS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
reached = []
for pid in others:
    for what in ("environ", "mem", "cwd", "root"):
        try:
            if what in ("cwd", "root"):
                os.listdir(f"/proc/{pid}/{what}")
            else:
                open(f"/proc/{pid}/{what}", "rb").read(1)
            reached.append((pid, what))
        except OSError:
            pass
    if libc.ptrace(16, pid, 0, 0) == 0:
        reached.append((pid, "ptrace"))
print(len(others) > 0, reached)
"""


def test_a_pool_pod_serves_many_runs_each_in_a_fresh_box(
    pool_namespace: str,
    gateway: DeployedGateway,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    """One pool pod answers a tenant's runs one after another; no run sees anything an
    earlier one left, and a run past its memory ends OOMKilled at once while the sandbox
    serves on."""
    start_pool(custom_objects, pool_namespace, 1)
    [free] = pods_in_state(core_v1, pool_namespace, "py", "free")
    key = gateway.add_tenant(pool_namespace, pool_namespace)

    def run(code: str, **fields: Any) -> dict[str, Any]:
        with gateway.client(key) as http:
            response = http.post(
                "/v1/executions", json={"language": "python", "code": code, **fields}
            )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    left = run(LEAVE_EVERYTHING, timeout_seconds=30)
    assert (left["status"], left["stdout"].split()[0]) == ("success", "left"), left
    found = run(FIND_LEFTOVERS)
    assert found["stdout"] == "['main.py', 'outputs', 'work'] ['main.py'] []\n", found
    peeked = run(PEEK_AT_THE_OTHERS)
    assert peeked["stdout"] == "True []\n", peeked
    hog = run(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n", timeout_seconds=30
    )
    assert hog["status"] == "error" and hog["reason"] == "OOMKilled", hog
    assert "memory limit of 256Mi" in hog["error_message"], hog
    after = run("print('still serving')")
    assert after["stdout"] == "still serving\n", after
    for answer in (left, found, peeked, hog, after):
        record = wait_for(custom_objects, pool_namespace, answer["id"], timeout=RECORD_TIMEOUT)
        assert record["status"]["podName"] == free.metadata.name
    hog_record = wait_for(custom_objects, pool_namespace, hog["id"], timeout=RECORD_TIMEOUT)
    assert hog_record["status"]["reason"] == "OOMKilled", hog_record["status"]
