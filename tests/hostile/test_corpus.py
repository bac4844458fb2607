"""The hostile corpus (corpus.py) on the real cluster, under gVisor, then checks from the host.

All cases start together, CONCURRENCY at a time, each in a fresh namespace beside a benign
neighbour execution that must succeed with the right output. Each case is its own test, so
a failure names it; after them, the host is inspected: the node is healthy, no sandbox pod,
process or cgroup is left, nothing was written outside a sandbox, and the fake remote hosts
saw only the control pod.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from corpus import CASES as CONTAINMENT_CASES
from corpus import (
    MARKER,
    NEIGHBOUR_SOURCE,
    NEIGHBOUR_STDOUT,
    Case,
    observed_text,
    problems,
)
from corpus_integrity import INTEGRITY_CASES
from executions import manifest
from fake_hosts import FakeHosts, NetworkControl
from kubernetes import client
from results_table import Row
from sandpod_testkit.kube import GROUP, PLURAL, VERSION, create_namespace, delete_executions
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.waiting import wait_until
from tracker import ClusterTracker

# The node has two cores; five hostile programs (plus their neighbours) at once keep it busy
# without turning scheduling delays into the thing under test.
CONCURRENCY = 5
STATE_DIR = Path(os.environ.get("SANDPOD_CLUSTER_DIR", REPO_ROOT / ".cluster"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETWORK_CASES = {"another-pod", "egress-public-address", "cloud-metadata"}

CASES = CONTAINMENT_CASES + INTEGRITY_CASES

pytestmark = pytest.mark.usefixtures("sandpod_operator")


@dataclass
class CaseRun:
    case: Case
    namespace: str
    hostile: dict[str, Any]
    neighbour: dict[str, Any]


def run_case(
    case: Case,
    namespace: str,
    core_v1: client.CoreV1Api,
    objects: client.CustomObjectsApi,
    tracker: ClusterTracker,
    facts: dict[str, str],
) -> CaseRun:
    create_namespace(core_v1, namespace)
    labels = {"sandpod.dev/hostile-case": case.id}
    for name, spec in [
        ("hostile", case.spec_for(facts)),
        ("neighbour", {"language": "python", "source": NEIGHBOUR_SOURCE}),
    ]:
        body = manifest(name, spec)
        body["metadata"]["labels"] = labels
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    keys = [(namespace, "hostile"), (namespace, "neighbour")]
    tracker.wait_terminal(keys, timeout=case.timeout_seconds + case.slack_seconds)
    return CaseRun(case, namespace, tracker.status(keys[0]), tracker.status(keys[1]))


@pytest.fixture(scope="module")
def corpus_runs(
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tracker: ClusterTracker,
    hostile_prefix: str,
    cluster_facts: dict[str, str],
) -> Iterator[dict[str, Future[CaseRun]]]:
    """Starts the whole corpus (longest cases first); each test waits for its own case."""
    namespaces = {case.id: f"{hostile_prefix}-{case.id}" for case in CASES}
    pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="hostile")
    ordered = sorted(CASES, key=lambda case: -case.timeout_seconds)
    runs = {
        case.id: pool.submit(
            run_case, case, namespaces[case.id], core_v1, custom_objects, tracker, cluster_facts
        )
        for case in ordered
    }
    try:
        yield runs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as cleanup:
            list(cleanup.map(lambda ns: remove_namespace(core_v1, custom_objects, ns),
                             namespaces.values()))  # fmt: skip


def remove_namespace(
    core_v1: client.CoreV1Api, objects: client.CustomObjectsApi, namespace: str
) -> None:
    try:
        delete_executions(objects, namespace, timeout=120)
        core_v1.delete_namespace(namespace, propagation_policy="Background")
    except client.ApiException as error:
        if error.status != 404:
            raise


def neighbour_problems(status: dict[str, Any]) -> list[str]:
    if status.get("phase") != "Succeeded" or status.get("stdout") != NEIGHBOUR_STDOUT:
        return [f"the neighbour ended {observed_text(status)} with stdout {status.get('stdout')!r}"]
    return []


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_case(
    case: Case,
    corpus_runs: dict[str, Future[CaseRun]],
    cluster_facts: dict[str, str],
    network_control: NetworkControl,
    fake_hosts: FakeHosts,
    table_row: Row,
) -> None:
    table_row.expected = case.expected_text
    run = corpus_runs[case.id].result(timeout=case.timeout_seconds + case.slack_seconds + 600)
    table_row.observed = observed_text(run.hostile)
    found = problems(case, run.hostile, cluster_facts) + neighbour_problems(run.neighbour)
    if case.id in NETWORK_CASES:
        # The path exists (a pod without policy got through), so "blocked" is the policy's doing.
        found += [
            f"control pod could not reach {t}"
            for t, ok in network_control.reached.items()
            if not ok
        ]
        if len(fake_hosts.connections()) != network_control.fake_connections:
            found.append(f"the fake hosts were reached: {fake_hosts.connections()}")
    if found:
        table_row.observed += f" ({found[0][:80]})"
    assert not found, f"{case.id}: {case.why}\n" + "\n".join(found)


# --- after the corpus, from the host ----------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_done(corpus_runs: dict[str, Future[CaseRun]]) -> list[CaseRun]:
    return [future.result(timeout=900) for future in corpus_runs.values()]


def test_node_stays_healthy(
    corpus_done: list[CaseRun], core_v1: client.CoreV1Api, table_row: Row
) -> None:
    table_row.expected = "Ready, no pressure"
    node: Any = core_v1.list_node().items[0]
    conditions = {c.type: c.status for c in node.status.conditions}
    bad = {
        kind: state for kind, state in conditions.items() if (kind == "Ready") != (state == "True")
    }
    table_row.observed = ", ".join(f"{k}={v}" for k, v in bad.items()) or "Ready, no pressure"
    assert not bad, conditions


def test_no_sandbox_pod_left(
    corpus_done: list[CaseRun], core_v1: client.CoreV1Api, table_row: Row
) -> None:
    table_row.expected = "no pods in the corpus namespaces"

    def remaining() -> list[str]:
        return [
            f"{run.namespace}/{pod.metadata.name}"
            for run in corpus_done
            for pod in core_v1.list_namespaced_pod(run.namespace).items
        ]

    try:
        wait_until(lambda: not remaining(), timeout=60, what="the sandbox pods to go")
    finally:
        table_row.observed = ", ".join(remaining()) or "none"


def processes_of_pods(pod_uids: set[str]) -> list[str]:
    """Host processes that belong to one of these pods (by cgroup or command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(uid in cgroups or uid in command for uid in pod_uids):
            found.append(f"{proc.name}: {command[:120]}")
    return found


def pod_cgroups(pod_uids: set[str]) -> list[str]:
    """Cgroup directories the kubelet made for these pods, in any hierarchy."""
    names = {f"pod{uid}" for uid in pod_uids}
    return [
        str(path)
        for hierarchy in CGROUP_ROOT.iterdir()
        if (hierarchy / "kubepods").is_dir()
        for path in (hierarchy / "kubepods").rglob("pod*")
        if path.name in names
    ]


def test_no_sandbox_process_or_cgroup_left(
    corpus_done: list[CaseRun], tracker: ClusterTracker, table_row: Row
) -> None:
    table_row.expected = "no process, no cgroup of any sandbox pod"
    pod_uids = set().union(
        *(
            tracker.pods_of((run.namespace, name))
            for run in corpus_done
            for name in ("hostile", "neighbour")
        )
    )
    assert len(pod_uids) >= len(corpus_done), "the tracker missed sandbox pods"

    def leftovers() -> list[str]:
        return processes_of_pods(pod_uids) + pod_cgroups(pod_uids)

    try:
        wait_until(lambda: not leftovers(), timeout=60, what="sandbox processes and cgroups to go")
    finally:
        left = leftovers()
        table_row.observed = (
            f"{len(left)} left of {len(pod_uids)} pods" if left else f"none ({len(pod_uids)} pods)"
        )


def test_each_execution_ran_one_pod(
    corpus_done: list[CaseRun], tracker: ClusterTracker, table_row: Row
) -> None:
    table_row.expected = "one pod per execution, one terminal status"
    counts = {
        f"{run.namespace}/{name}": (
            len(tracker.pods_of((run.namespace, name))),
            len(tracker.terminal_statuses_of((run.namespace, name))),
        )
        for run in corpus_done
        for name in ("hostile", "neighbour")
    }
    wrong = {key: count for key, count in counts.items() if count != (1, 1)}
    table_row.observed = f"{len(wrong)} wrong of {len(counts)}" if wrong else f"all {len(counts)}"
    assert not wrong, wrong


def marker_files() -> list[str]:
    """Files named like the corpus's marker anywhere the sandboxes' storage lives, and at the
    paths the corpus tried to write."""
    tried = [
        Path(p) / MARKER
        for p in ["/", "/etc", "/usr/bin", "/var/tmp", "/opt/sandpod", "/tmp", "/dev/shm", "/dev"]
    ]
    found = [str(path) for path in tried if path.exists()]
    roots = [
        STATE_DIR / "kubelet",
        STATE_DIR / "containerd",
        Path("/run/sandpod"),
        Path("/var/log/pods"),
    ]
    completed = subprocess.run(
        ["find", *(str(r) for r in roots if r.exists()), "-name", f"{MARKER}*"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return found + completed.stdout.split()


def test_nothing_written_outside_the_sandboxes(corpus_done: list[CaseRun], table_row: Row) -> None:
    table_row.expected = f"no {MARKER} on the host"
    try:
        wait_until(lambda: not marker_files(), timeout=60, what=f"no {MARKER} on the host")
    finally:
        table_row.observed = ", ".join(marker_files()) or "none"


def test_fake_hosts_saw_only_the_control_pod(
    corpus_done: list[CaseRun],
    fake_hosts: FakeHosts,
    network_control: NetworkControl,
    table_row: Row,
) -> None:
    table_row.expected = f"{network_control.fake_connections} connections (the control pod's)"
    connections = fake_hosts.connections()
    table_row.observed = f"{len(connections)} connections"
    assert network_control.fake_connections >= 2, network_control
    assert len(connections) == network_control.fake_connections, connections
