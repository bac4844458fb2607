"""A session is one trust domain (docs/runner-protocol.md): a run can take over its Python
session's kernel and answer for every later run of that session, and the record says whose
word such a result is (`reportedBy: sessionKernel`, where a run-once execution's is
`runner`). What holds regardless: another session of the same tenant answers honestly, a
hijacked kernel still ends at its run's timeout (a fresh kernel answers the next run), and
it does not outlive its session (the idle timeout ends the session and deletes its pod).

Needs the runner, operator and gateway images built from this tree (the runner's `kernel`
field, the status's `reportedBy`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from chart_release import DeployedGateway
from executions import RECORD_TIMEOUT, status, wait_for
from kubernetes import client
from results_table import Row
from sandpod_contract.names import SESSION_PLURAL
from sandpod_testkit.kube import GROUP, VERSION, is_gone
from sandpod_testkit.sessions import open_session, run_in
from sandpod_testkit.waiting import wait_until

pytestmark = pytest.mark.usefixtures("sandpod_operator")

# Run 1 rebinds what the kernel calls to run a cell (the loop's closure cells): every later
# cell "prints" FORGED and "succeeds" without running.
TAKE_OVER = """import sys
loop = sys._getframe(0).f_back.f_back
run = loop.f_locals["run"]
cells = dict(zip(run.__code__.co_freevars, run.__closure__))
cells["exec_"].cell_contents = lambda code, namespace: print("FORGED")
cells["eval_"].cell_contents = lambda code, namespace: None
"""
# Run 1 makes every later cell hang.
HANG = """import sys, time
loop = sys._getframe(0).f_back.f_back
run = loop.f_locals["run"]
cells = dict(zip(run.__code__.co_freevars, run.__closure__))
cells["exec_"].cell_contents = lambda code, namespace: time.sleep(3600)
"""
HONEST = "print('real'); import sys; sys.exit(7)"
READY_TIMEOUT = 120
IDLE_TIMEOUT_SECONDS = 20


@pytest.fixture
def tenant(gateway: DeployedGateway, hostile_namespace: str) -> Iterator[httpx.Client]:
    key = gateway.add_tenant(hostile_namespace, hostile_namespace, maxSessions=2)
    with gateway.client(key) as http:
        yield http


def recorded(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    """The run's record once written (a session run's is written behind its answer)."""
    return status(wait_for(objects, namespace, name, timeout=RECORD_TIMEOUT))


def ended_session(
    objects: client.CustomObjectsApi, namespace: str, name: str
) -> dict[str, Any] | None:
    """The CodeSession's status once it has ended, else None."""
    found: Any = objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, SESSION_PLURAL, name
    )
    session_status = dict(found.get("status") or {})
    return session_status if session_status.get("phase") == "Ended" else None


def outcome(result: dict[str, Any]) -> tuple[Any, ...]:
    return (result["status"], result["exit_code"], result["stdout"], result["reported_by"])


def test_a_run_that_takes_over_the_kernel_answers_for_later_runs_and_the_record_says_so(
    tenant: httpx.Client,
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    table_row.expected = (
        "hijacked session: success/0/FORGED by sessionKernel; other session and run-once: "
        "error/7/real, by sessionKernel and runner"
    )
    hijacked, other = open_session(tenant), open_session(tenant)
    try:
        taken = run_in(tenant, hijacked, TAKE_OVER)
        forged = run_in(tenant, hijacked, "print('real'); sys.exit(7)")
        honest = run_in(tenant, other, HONEST)
    finally:
        for session in (hijacked, other):
            tenant.delete(f"/v1/sessions/{session}")
    once = tenant.post("/v1/executions", json={"language": "python", "code": HONEST})
    assert once.status_code == 200, once.text
    run_once = once.json()

    table_row.observed = "; ".join(
        f"{name}: {'/'.join(str(part).strip() for part in outcome(result))}"
        for name, result in (("hijacked", forged), ("other", honest), ("run-once", run_once))
    )
    assert taken["status"] == "success", taken
    assert outcome(forged) == ("success", 0, "FORGED\n", "sessionKernel")
    assert recorded(custom_objects, hostile_namespace, forged["id"])["reportedBy"] == (
        "sessionKernel"
    )
    assert outcome(honest) == ("error", 7, "real\n", "sessionKernel")
    assert outcome(run_once) == ("error", 7, "real\n", "runner")
    assert recorded(custom_objects, hostile_namespace, run_once["id"])["reportedBy"] == "runner"


def test_a_hijacked_kernel_still_ends_at_its_timeout_and_with_its_session(
    tenant: httpx.Client,
    hostile_namespace: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    table_row.expected = (
        "hung run: timeout, state lost; next run honest (7); session ended idle, pod deleted"
    )
    session = open_session(tenant, idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    try:
        run_in(tenant, session, HANG)
        hung = run_in(tenant, session, "print('never')", timeout_seconds=3)
        after = run_in(tenant, session, HONEST)
        pod = recorded(custom_objects, hostile_namespace, after["id"])["podName"]
        ended = wait_until(
            lambda: ended_session(custom_objects, hostile_namespace, session),
            timeout=READY_TIMEOUT,
            what=f"session {session} to end at its idle timeout",
            interval=0.5,
        )
        wait_until(
            lambda: is_gone(lambda: core_v1.read_namespaced_pod(pod, hostile_namespace)),
            timeout=READY_TIMEOUT,
            what=f"the session's pod {pod} to be deleted",
        )
    finally:
        tenant.delete(f"/v1/sessions/{session}")

    table_row.observed = (
        f"hung: {hung['status']}, state_lost {hung['state_lost']}; next: {after['exit_code']} "
        f"{after['stdout'].strip()}; session {ended['phase']}/{ended.get('reason')}, pod gone"
    )
    assert (hung["status"], hung["state_lost"], hung["reported_by"]) == (
        "timeout",
        True,
        "sessionKernel",
    )
    assert (after["status"], after["exit_code"], after["stdout"]) == ("error", 7, "real\n")
    assert after["state_lost"] is True  # a fresh kernel: the hijack is gone with the old one
    assert ended["reason"] == "IdleTimeout", ended
