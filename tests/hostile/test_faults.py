"""Faults during batches of executions: the operator killed with SIGKILL, the gateway killed
and started again while clients wait, kube-apiserver restarted.

Every execution must reach its terminal phase exactly once: one pod ever created for it (the
tracker sees every pod), one terminal status that never changes afterwards, at most one
terminal Event, and the right output. Nothing is lost and nothing runs twice.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from chart_release import Deployed, DeployedGateway
from executions import manifest
from kubernetes import client
from results_table import Row
from sandpod_contract.names import RECORD_DIRECT, RECORD_LABEL
from sandpod_testkit.kube import GROUP, PLURAL, VERSION
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.waiting import wait_until
from tracker import ClusterTracker

RESTART_APISERVER = REPO_ROOT / "hack" / "cluster" / "restart-apiserver.sh"
PID_FILE = REPO_ROOT / ".cluster" / "pids" / "kube-apiserver.pid"
# Fifty sandboxes on two cores, with a pause in the middle: minutes, not seconds.
BATCH_TIMEOUT = 420
RETRY_PAUSE_SECONDS = 0.5

pytestmark = pytest.mark.usefixtures("sandpod_operator")


def batch_source(index: int) -> str:
    return f"sleep 1\necho done {index}\n"


def submit(objects: client.CustomObjectsApi, namespace: str, indexes: range) -> None:
    for index in indexes:
        body = manifest(f"batch-{index}", {"language": "bash", "source": batch_source(index)})
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def batch_problems(
    tracker: ClusterTracker, core_v1: client.CoreV1Api, namespace: str, count: int
) -> tuple[Counter[str], list[str]]:
    """Waits for executions batch-0..count-1 and says what is wrong with any of them."""
    keys = [(namespace, f"batch-{index}") for index in range(count)]
    tracker.wait_terminal(keys, timeout=BATCH_TIMEOUT)
    selector = "involvedObject.kind=CodeExecution"
    terminal_events: Counter[str] = Counter()
    for event in core_v1.list_namespaced_event(namespace, field_selector=selector).items:
        if event.reason in ("Succeeded", "Failed", "TimedOut", "Error", "Cancelled"):
            terminal_events[event.involved_object.name] += event.count or 1
    phases: Counter[str] = Counter()
    found = []
    for index, key in enumerate(keys):
        status = tracker.status(key)
        phases[str(status.get("phase"))] += 1
        name = key[1]
        if status.get("phase") != "Succeeded" or status.get("stdout") != f"done {index}\n":
            found.append(f"{name}: {status.get('phase')}/{status.get('reason')} {status}")
        if len(pods := tracker.pods_of(key)) != 1:
            found.append(f"{name}: {len(pods)} pods were created")
        if len(results := tracker.terminal_statuses_of(key)) != 1:
            found.append(f"{name}: terminal status written {len(results)} ways: {results}")
        if terminal_events[name] > 1:
            found.append(f"{name}: {terminal_events[name]} terminal events")
    return phases, found


def summary(phases: Counter[str], found: list[str]) -> str:
    text = ", ".join(f"{count} {phase}" for phase, count in sorted(phases.items()))
    return text + (f"; {len(found)} problems" if found else "; one pod and one result each")


def sandbox_pods(core_v1: client.CoreV1Api, namespace: str) -> list[Any]:
    return list(core_v1.list_namespaced_pod(namespace).items)


@dataclass
class Batch:
    """A batch of executions batch-<index> in a fresh namespace, and what checks it."""

    namespace: str
    objects: client.CustomObjectsApi
    core_v1: client.CoreV1Api
    tracker: ClusterTracker
    operator: Deployed
    row: Row

    def submit(self, indexes: range) -> None:
        submit(self.objects, self.namespace, indexes)

    def pods(self) -> list[Any]:
        return sandbox_pods(self.core_v1, self.namespace)

    def check(self, count: int) -> None:
        """Each of batch-0..count-1 ends once, with one pod, one result and the right output."""
        phases, found = batch_problems(self.tracker, self.core_v1, self.namespace, count)
        self.row.observed = summary(phases, found)
        assert not found, "\n".join(found[:20]) + "\n" + self.operator.log_tail()


@pytest.fixture
def batch(
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    tracker: ClusterTracker,
    operator_running: Deployed,
    table_row: Row,
) -> Batch:
    return Batch(hostile_namespace, custom_objects, core_v1, tracker, operator_running, table_row)


def test_operator_killed_mid_batch_of_50(batch: Batch) -> None:
    batch.row.expected = "50 Succeeded; one pod and one result each"
    batch.submit(range(25))
    # The node fits about 40 sandboxes at once (2 CPUs, 50m requested each; more are
    # Unschedulable): the second half starts only once the first half's pods exist.
    wait_until(
        lambda: len(batch.tracker.pods_in(batch.namespace)) >= 25,
        timeout=120,
        what="a pod for each of the first 25 executions",
    )
    batch.operator.kill()
    try:
        # While it is down, the rest of the batch arrives and the first half's pods finish:
        # their results wait in the pods, the new executions wait for theirs.
        batch.submit(range(25, 50))
        wait_until(
            lambda: all(p.status.phase in ("Succeeded", "Failed") for p in batch.pods()),
            timeout=180,
            what="the first half's sandboxes to finish while the operator is down",
        )
    finally:
        batch.operator.start()
    batch.check(50)


def run_with_retries(
    gateway: DeployedGateway,
    key: str,
    index: int,
    path: str = "/v1/executions",
    body: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], int]:
    """One agent: creates an execution (by default batch `index` in bash) and waits for its
    result, retrying the same request (same Idempotency-Key) whenever the gateway is
    unreachable or answers 5xx."""
    body = body or {"language": "bash", "code": batch_source(index)}
    headers = {"Idempotency-Key": f"hostile-{index}-{uuid.uuid4().hex}"}
    deadline = time.monotonic() + BATCH_TIMEOUT
    attempts = 0
    with gateway.client(key) as http:
        while True:
            attempts += 1
            try:
                response = http.post(path, json=body, headers=headers)
                if response.status_code == 200:
                    return response.json(), attempts
                if response.status_code < 500 and response.status_code != 202:
                    raise AssertionError(f"{response.status_code}: {response.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"client {index}: no result after {attempts} attempts")
            time.sleep(RETRY_PAUSE_SECONDS)


def test_gateway_restarted_while_clients_wait(
    hostile_namespace: str,
    gateway: DeployedGateway,
    custom_objects: client.CustomObjectsApi,
    tracker: ClusterTracker,
    table_row: Row,
) -> None:
    clients = 20
    table_row.expected = f"{clients} results, {clients} executions (no duplicate, no loss)"
    key = gateway.add_tenant(
        hostile_namespace, hostile_namespace, maxConcurrent=clients, maxTimeoutSeconds=60
    )

    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(run_with_retries, gateway, key, index) for index in range(clients)]
        wait_until(
            lambda: len(tracker.names_in(hostile_namespace)) >= clients // 4,
            timeout=60,
            what="the first executions",
        )
        gateway.kill()
        gateway.start()
        outcomes = [future.result(timeout=BATCH_TIMEOUT + 60) for future in futures]

    listed = custom_objects.list_namespaced_custom_object(GROUP, VERSION, hostile_namespace, PLURAL)
    ids = {result["id"] for result, _ in outcomes}
    wrong = [
        (index, result["status"], result.get("stdout"))
        for index, (result, _) in enumerate(outcomes)
        if result["status"] != "success" or result.get("stdout") != f"done {index}\n"
    ]
    retried = sum(1 for _, attempts in outcomes if attempts > 1)
    table_row.observed = (
        f"{len(ids)} results, {len(listed['items'])} executions, {retried} clients retried"
    )
    assert not wrong, wrong
    assert len(ids) == clients
    assert len(listed["items"]) == clients, [i["metadata"]["name"] for i in listed["items"]]
    assert retried > 0, "the restart interrupted no request: the test proved nothing"


SESSION_COUNTS = "import time\ntime.sleep(0.3)\nn = globals().get('n', 0) + 1\nn"


def direct_records(objects: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    listed = objects.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{RECORD_LABEL}={RECORD_DIRECT}"
    )
    return list(listed["items"])


def test_gateway_killed_while_session_runs_wait(
    hostile_namespace: str,
    gateway: DeployedGateway,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    clients = 8
    table_row.expected = f"{clients} session runs (direct path), each run and recorded once"
    key = gateway.add_tenant(hostile_namespace, hostile_namespace, maxTimeoutSeconds=60)
    with gateway.client(key) as http:
        opened = http.post("/v1/sessions", json={"language": "python"})
    assert opened.status_code == 201, opened.text
    path = f"/v1/sessions/{opened.json()['id']}/executions"
    body = {"code": SESSION_COUNTS}

    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [
            pool.submit(run_with_retries, gateway, key, index, path, body)
            for index in range(clients)
        ]
        wait_until(
            lambda: len(direct_records(custom_objects, hostile_namespace)) >= 2,
            timeout=120,
            what="the first session runs to start",
        )
        gateway.kill()
        gateway.start()
        outcomes = [future.result(timeout=BATCH_TIMEOUT) for future in futures]

    records = wait_until(
        lambda: [
            record
            for record in direct_records(custom_objects, hostile_namespace)
            if (record.get("status") or {}).get("phase")
        ],
        timeout=60,
        what="every record's status",
    )
    counts = sorted(int(result["result"]) for result, _ in outcomes)
    retried = sum(1 for _, attempts in outcomes if attempts > 1)
    table_row.observed = (
        f"counts {counts[0]}..{counts[-1]}, {len(records)} records, {retried} clients retried"
    )
    assert counts == list(range(1, clients + 1)), outcomes
    assert len(records) == clients, [r["metadata"]["name"] for r in records]
    assert {r["status"]["phase"] for r in records} == {"Succeeded"}
    assert retried > 0, "the kill interrupted no request: the test proved nothing"


def test_apiserver_restarted_mid_batch(batch: Batch) -> None:
    batch.row.expected = "20 Succeeded after the restart; one pod and one result each"
    if not PID_FILE.is_file():
        pytest.fail(f"{PID_FILE} is missing: this test restarts the local cluster's API server")
    batch.submit(range(20))
    wait_until(
        lambda: len(batch.pods()) >= 5,
        timeout=120,
        what="the first sandbox pods",
    )
    restarted = subprocess.run(
        [str(RESTART_APISERVER), "--down-seconds", "5"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    batch.check(20)
