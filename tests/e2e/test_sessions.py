"""CodeSessions on the cluster: executions that name a session run in its one sandbox, in
order, keeping files and the Python interpreter's state (the session design).

The session release's operator (a test kills its pod) reaches the sandboxes' runners through
the chart's NetworkPolicies. It needs the runner's session mode (`--serve CONFIG --session`) in
the sandbox images.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart_release import Deployed
from executions import TERMINAL, create, events_about, get, status, wait_for
from kubernetes import client
from pool_helpers import pool_counts, start_pool
from sandpod_contract.names import SESSION_PLURAL
from sandpod_testkit.kube import GROUP, VERSION, is_gone
from sandpod_testkit.waiting import wait_until

# warm_namespace: a fresh namespace per test that the session's release serves.
from test_warm import warm_namespace

__all__ = ["warm_namespace"]

READY_TIMEOUT = 120
RUN_TIMEOUT = 120
Session = dict[str, Any]


def session_of(objects: client.CustomObjectsApi, namespace: str, name: str) -> Session:
    found: Any = objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, SESSION_PLURAL, name
    )
    return dict(found.get("status") or {})


def open_session(
    objects: client.CustomObjectsApi, namespace: str, name: str = "nb", **spec: Any
) -> Session:
    """A Ready python session."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CodeSession",
        "metadata": {"name": name},
        "spec": {"language": "python", **spec},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, body)
    wait_until(
        lambda: session_of(objects, namespace, name).get("phase") == "Ready",
        timeout=READY_TIMEOUT,
        what=f"session {name} to be Ready",
        interval=0.5,
    )
    return session_of(objects, namespace, name)


def run(
    objects: client.CustomObjectsApi, namespace: str, name: str, source: str, **spec: Any
) -> dict[str, Any]:
    """One execution in session nb: its final status."""
    create(objects, namespace, name, language="python", source=source, session="nb", **spec)
    return status(wait_for(objects, namespace, name, timeout=RUN_TIMEOUT))


def test_two_executions_share_a_variable_and_a_file(
    warm_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    open_session(custom_objects, warm_namespace)
    first = run(custom_objects, warm_namespace, "x1", "x = 41\nopen('f.txt', 'w').write('hi')")
    assert first["phase"] == "Succeeded", first
    second = run(custom_objects, warm_namespace, "x2", "print(x + 1, open('f.txt').read())")
    assert (second["phase"], second["stdout"]) == ("Succeeded", "42 hi\n"), second
    assert second["reportedBy"] == "sessionKernel"  # a session is one trust domain
    assert session_of(custom_objects, warm_namespace, "nb")["executionCount"] == 2


def test_a_trailing_expressions_value_is_returned(
    warm_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    open_session(custom_objects, warm_namespace)
    done = run(custom_objects, warm_namespace, "x1", "answer = 6 * 7\nanswer")
    assert (done["phase"], done.get("result")) == ("Succeeded", "42"), done


def test_a_timeout_then_a_working_execution_that_reports_the_lost_state(
    warm_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    open_session(custom_objects, warm_namespace)
    slow = run(
        custom_objects,
        warm_namespace,
        "x1",
        "import time\ny = 1\ntime.sleep(60)",
        timeoutSeconds=2,
    )
    assert slow["phase"] == "TimedOut", slow
    after = run(custom_objects, warm_namespace, "x2", "print('y' in globals())")
    assert (after["phase"], after["stdout"], after.get("stateLost")) == (
        "Succeeded",
        "False\n",
        True,
    ), after


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"idleTimeoutSeconds": 10}, "IdleTimeout"),
        ({"maxLifetimeSeconds": 60, "idleTimeoutSeconds": 86400}, "LifetimeExceeded"),
    ],
)
def test_a_session_ends_after_its_idle_timeout_or_lifetime(
    warm_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    spec: dict[str, int],
    reason: str,
) -> None:
    pod = open_session(custom_objects, warm_namespace, **spec)["podName"]
    wait_until(
        lambda: session_of(custom_objects, warm_namespace, "nb").get("phase") == "Ended",
        timeout=120,
        what="the session to end",
        interval=1,
    )
    assert session_of(custom_objects, warm_namespace, "nb")["reason"] == reason
    wait_until(
        lambda: is_gone(lambda: core_v1.read_namespaced_pod(pod, warm_namespace)),
        timeout=60,
        what="the session pod to be deleted",
    )
    late = run(custom_objects, warm_namespace, "late", "print(1)")
    assert (late["phase"], late["reason"]) == ("Error", "SessionEnded"), late


def test_operator_killed_while_executions_wait_each_ends_once_in_order(
    warm_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    operator_running: Deployed,
) -> None:
    operator = operator_running
    open_session(custom_objects, warm_namespace)
    source = "import time\ntime.sleep(3)\nn = 0"
    create(custom_objects, warm_namespace, "x0", language="python", source=source, session="nb")
    names = [f"x{index}" for index in range(1, 5)]
    for name in names:
        create(
            custom_objects,
            warm_namespace,
            name,
            language="python",
            source="n += 1\nprint(n)",
            session="nb",
        )
    wait_until(
        lambda: status(get(custom_objects, warm_namespace, "x0") or {}).get("phase") == "Running",
        timeout=RUN_TIMEOUT,
        what="the first execution to run",
        interval=0.2,
    )
    operator.kill()
    operator.start()
    for index, name in enumerate(names, 1):
        done = status(wait_for(custom_objects, warm_namespace, name, timeout=RUN_TIMEOUT))
        assert (done["phase"], done["stdout"]) == ("Succeeded", f"{index}\n"), done
    for name in ["x0", *names]:
        ended = [
            e.reason
            for e in events_about(core_v1, warm_namespace, "CodeExecution", name)
            if e.reason in TERMINAL
        ]
        assert ended == ["Succeeded"], (name, ended, operator.log_tail())
    assert session_of(custom_objects, warm_namespace, "nb")["executionCount"] == 5


def test_a_session_starts_from_a_pool(
    warm_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    start_pool(custom_objects, warm_namespace, 1, sessions=True)
    started = open_session(custom_objects, warm_namespace, pool="py")
    assert started["startMode"] == "warm"
    done = run(custom_objects, warm_namespace, "x1", "print(1)")
    assert (done["phase"], done["stdout"]) == ("Succeeded", "1\n"), done
    wait_until(
        lambda: pool_counts(custom_objects, warm_namespace, "py") == (1, 1),
        timeout=120,
        what="the pool to refill",
        interval=0.5,
    )
