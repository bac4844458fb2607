"""The hostile corpus (corpus.py) on the real cluster, under gVisor, then checks from the host.

First the network cases' programs run in a pod without any NetworkPolicy (policy_free.py),
where each must reach its targets. Then all cases start together, CONCURRENCY at a time, each
in a fresh namespace beside a benign neighbour execution that must succeed with the right
output. Each case is its own test, so a failure names it, and its row in the results table
shows the case's proof of containment next to what was observed. After them, the host is
inspected: the node is healthy, no sandbox pod, process or cgroup is left, nothing was
written outside a sandbox, and the fake remote hosts saw only the pods without policy.
"""

from __future__ import annotations

import os
import subprocess
import uuid
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
    observed_proof,
    observed_text,
    problems,
)
from corpus_integrity import INTEGRITY_CASES
from executions import manifest
from fake_hosts import FakeHosts
from kubernetes import client
from policy_free import PolicyFreeRun, network_facts, run_policy_free
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
# The kubelet's cgroupfs layout (hack/cluster/up.sh): pods by QoS class.
QOS_CGROUPS = ("kubepods", "kubepods/burstable", "kubepods/besteffort")
# Generous: the neighbour takes about a second, but shares two cores with hostile programs.
NEIGHBOUR_TIMEOUT_SECONDS = 120

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
        (
            "neighbour",
            {
                "language": "python",
                "source": NEIGHBOUR_SOURCE,
                "timeoutSeconds": NEIGHBOUR_TIMEOUT_SECONDS,
            },
        ),
    ]:
        body = manifest(name, spec)
        body["metadata"]["labels"] = labels
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    keys = [(namespace, "hostile"), (namespace, "neighbour")]
    longest = max(case.timeout_seconds, NEIGHBOUR_TIMEOUT_SECONDS)
    tracker.wait_terminal(keys, timeout=longest + case.slack_seconds)
    return CaseRun(case, namespace, tracker.status(keys[0]), tracker.status(keys[1]))


@pytest.fixture(scope="module")
def facts(cluster_facts: dict[str, str], api_client: client.ApiClient) -> dict[str, str]:
    """The cluster facts the corpus's arguments and checks name, with the cluster's own
    addresses (the API server's Service and endpoint, the DNS Service)."""
    return {**cluster_facts, **network_facts(api_client)}


@dataclass(frozen=True)
class PolicyFree:
    runs: dict[str, PolicyFreeRun]
    fake_connections: int  # what the fake hosts saw by then: the control pods' connections


@pytest.fixture(scope="module")
def policy_free(
    core_v1: client.CoreV1Api,
    hostile_prefix: str,
    facts: dict[str, str],
    fake_hosts: FakeHosts,
) -> Iterator[PolicyFree]:
    """Each network case's program, run without the policy before any sandbox starts."""
    namespace = f"{hostile_prefix}-policy-free-{uuid.uuid4().hex[:4]}"
    create_namespace(core_v1, namespace)
    try:
        assert fake_hosts.routed_here(), "pod traffic to the fake hosts would leave the machine"
        runs = run_policy_free(core_v1, namespace, CASES, facts)
        yield PolicyFree(runs, len(fake_hosts.connections()))
    finally:
        core_v1.delete_namespace(namespace, propagation_policy="Background", grace_period_seconds=0)


@pytest.fixture(scope="module")
def corpus_runs(
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tracker: ClusterTracker,
    hostile_prefix: str,
    facts: dict[str, str],
    policy_free: PolicyFree,
) -> Iterator[dict[str, Future[CaseRun]]]:
    """Starts the whole corpus (longest cases first); each test waits for its own case."""
    namespaces = {case.id: f"{hostile_prefix}-{case.id}" for case in CASES}
    pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="hostile")
    ordered = sorted(CASES, key=lambda case: -case.timeout_seconds)
    runs = {
        case.id: pool.submit(
            run_case, case, namespaces[case.id], core_v1, custom_objects, tracker, facts
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
    facts: dict[str, str],
    policy_free: PolicyFree,
    fake_hosts: FakeHosts,
    table_row: Row,
) -> None:
    table_row.expected = case.proof
    run = corpus_runs[case.id].result(timeout=case.timeout_seconds + case.slack_seconds + 600)
    table_row.observed = observed_proof(run.hostile)
    found = problems(case, run.hostile, facts) + neighbour_problems(run.neighbour)
    if case.policy_free_stdout is not None:
        without = policy_free.runs[case.id]
        table_row.observed = f"without policy: {without.summary()}; sandbox: {table_row.observed}"
        found = without.problems(case) + found
        if len(fake_hosts.connections()) != policy_free.fake_connections:
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
    """Cgroup directories the kubelet made for these pods, in any hierarchy: looked up by
    name under each QoS class (a walk of the tree races with the kubelet removing pods')."""
    return [
        str(path)
        for hierarchy in CGROUP_ROOT.iterdir()
        for qos in QOS_CGROUPS
        for uid in pod_uids
        if (path := hierarchy / qos / f"pod{uid}").is_dir()
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


def test_fake_hosts_saw_only_the_pods_without_policy(
    corpus_done: list[CaseRun],
    fake_hosts: FakeHosts,
    policy_free: PolicyFree,
    table_row: Row,
) -> None:
    table_row.expected = f"{policy_free.fake_connections} connections (pods without policy)"
    connections = fake_hosts.connections()
    table_row.observed = f"{len(connections)} connections"
    assert policy_free.fake_connections >= 2, policy_free
    assert len(connections) == policy_free.fake_connections, connections
