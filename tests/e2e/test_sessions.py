"""CodeSessions on the cluster: executions that name a session run in its one sandbox, in
order, keeping files and the Python interpreter's state (the session design).

This module runs an operator of its own, on namespaces of its own (`sess-<id>-*`), whose
runner port is open to this machine (the operator runs here). It needs the runner's session
mode (`--serve CONFIG --session`) in the sandbox images.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executions import TERMINAL, create, events_about, get, status, wait_for
from kubernetes import client
from operator_process import operator_reaching_runners
from sandpod_contract.names import SESSION_PLURAL
from sandpod_testkit.components import OperatorProcess
from sandpod_testkit.kube import GROUP, VERSION, delete_executions, is_gone
from sandpod_testkit.waiting import wait_until
from test_pools import namespace_with_pools, pool_counts
from test_warm import start_pool

READY_TIMEOUT = 120
RUN_TIMEOUT = 120
Session = dict[str, Any]


@pytest.fixture(scope="module")
def session_operator(
    sandpod_crd: str,
    kubeconfig_path: Path,
    core_v1: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[OperatorProcess, str]]:
    """An operator watching `sess-<id>-*` only, with the runner port open to this machine."""
    workdir = tmp_path_factory.mktemp("sess")
    with operator_reaching_runners("sess", kubeconfig_path, core_v1, workdir) as started:
        yield started


@pytest.fixture
def session_namespace(
    session_operator: tuple[OperatorProcess, str],
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> Iterator[str]:
    name = f"{session_operator[1]}-{uuid.uuid4().hex[:6]}"
    with namespace_with_pools(name, core_v1, custom_objects):
        yield name
        delete_executions(custom_objects, name, timeout=120)
        # Sessions carry the operator's finalizer: delete them while the operator runs.
        custom_objects.delete_collection_namespaced_custom_object(
            GROUP, VERSION, name, SESSION_PLURAL
        )
        wait_until(
            lambda: not sessions_in(custom_objects, name),
            timeout=60,
            what=f"the sessions in {name} to be deleted",
        )


def sessions_in(objects: client.CustomObjectsApi, namespace: str) -> list[Any]:
    listed: Any = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL)
    return list(listed["items"])


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
    session_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    open_session(custom_objects, session_namespace)
    first = run(custom_objects, session_namespace, "x1", "x = 41\nopen('f.txt', 'w').write('hi')")
    assert first["phase"] == "Succeeded", first
    second = run(custom_objects, session_namespace, "x2", "print(x + 1, open('f.txt').read())")
    assert (second["phase"], second["stdout"]) == ("Succeeded", "42 hi\n"), second
    assert session_of(custom_objects, session_namespace, "nb")["executionCount"] == 2


def test_a_trailing_expressions_value_is_returned(
    session_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    open_session(custom_objects, session_namespace)
    done = run(custom_objects, session_namespace, "x1", "answer = 6 * 7\nanswer")
    assert (done["phase"], done.get("result")) == ("Succeeded", "42"), done


def test_a_timeout_then_a_working_execution_that_reports_the_lost_state(
    session_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    open_session(custom_objects, session_namespace)
    slow = run(
        custom_objects,
        session_namespace,
        "x1",
        "import time\ny = 1\ntime.sleep(60)",
        timeoutSeconds=2,
    )
    assert slow["phase"] == "TimedOut", slow
    after = run(custom_objects, session_namespace, "x2", "print('y' in globals())")
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
    session_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    spec: dict[str, int],
    reason: str,
) -> None:
    pod = open_session(custom_objects, session_namespace, **spec)["podName"]
    wait_until(
        lambda: session_of(custom_objects, session_namespace, "nb").get("phase") == "Ended",
        timeout=120,
        what="the session to end",
        interval=1,
    )
    assert session_of(custom_objects, session_namespace, "nb")["reason"] == reason
    wait_until(
        lambda: is_gone(lambda: core_v1.read_namespaced_pod(pod, session_namespace)),
        timeout=60,
        what="the session pod to be deleted",
    )
    late = run(custom_objects, session_namespace, "late", "print(1)")
    assert (late["phase"], late["reason"]) == ("Error", "SessionEnded"), late


def test_operator_killed_while_executions_wait_each_ends_once_in_order(
    session_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    session_operator: tuple[OperatorProcess, str],
) -> None:
    operator = session_operator[0]
    open_session(custom_objects, session_namespace)
    source = "import time\ntime.sleep(3)\nn = 0"
    create(custom_objects, session_namespace, "x0", language="python", source=source, session="nb")
    names = [f"x{index}" for index in range(1, 5)]
    for name in names:
        create(
            custom_objects,
            session_namespace,
            name,
            language="python",
            source="n += 1\nprint(n)",
            session="nb",
        )
    wait_until(
        lambda: (
            status(get(custom_objects, session_namespace, "x0") or {}).get("phase") == "Running"
        ),
        timeout=RUN_TIMEOUT,
        what="the first execution to run",
        interval=0.2,
    )
    operator.kill()
    operator.start()
    for index, name in enumerate(names, 1):
        done = status(wait_for(custom_objects, session_namespace, name, timeout=RUN_TIMEOUT))
        assert (done["phase"], done["stdout"]) == ("Succeeded", f"{index}\n"), done
    for name in ["x0", *names]:
        ended = [
            e.reason
            for e in events_about(core_v1, session_namespace, "CodeExecution", name)
            if e.reason in TERMINAL
        ]
        assert ended == ["Succeeded"], (name, ended, operator.log_tail())
    assert session_of(custom_objects, session_namespace, "nb")["executionCount"] == 5


def test_a_session_starts_from_a_pool(
    session_namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    start_pool(custom_objects, session_namespace, 1, sessions=True)
    started = open_session(custom_objects, session_namespace, pool="py")
    assert started["startMode"] == "warm"
    done = run(custom_objects, session_namespace, "x1", "print(1)")
    assert (done["phase"], done["stdout"]) == ("Succeeded", "1\n"), done
    wait_until(
        lambda: pool_counts(custom_objects, session_namespace, "py") == (1, 1),
        timeout=120,
        what="the pool to refill",
        interval=0.5,
    )
