"""Warm executions on the cluster: CodeExecutions that take a ready pod of a SandboxPool
and run over the serving runner's HTTP API (the warm design, docs/runner-protocol.md), each
in a fresh box; the pod serves its tenant's next run.

Pool pods run the real `sandpod-runner --serve`; the session release's operator (a test kills
its pod) takes them and reaches their runner port through the chart's NetworkPolicies.

Audits: each execution ends exactly once (one terminal Event, a terminal status) with its
own output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from chart_release import Deployed
from executions import TERMINAL, create, events_about, get, status, wait_for
from kubernetes import client
from pool_helpers import (
    POOL,
    fresh_pool_namespace,
    pods_in_state,
    pool_counts,
    start_pool,
    wait_for_refill,
)
from sandpod_testkit.kube import delete_executions
from sandpod_testkit.waiting import wait_until

BATCH_TIMEOUT = 600


@pytest.fixture
def warm_namespace(
    sandpod_operator: Deployed,
    namespace_prefix: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> Iterator[str]:
    """A fresh namespace per test, which the session's release serves; its executions are
    deleted before its pools."""
    with fresh_pool_namespace(f"{namespace_prefix}-warm", core_v1, custom_objects) as name:
        yield name
        delete_executions(custom_objects, name, timeout=120)


def run_batch(objects: client.CustomObjectsApi, namespace: str, indexes: range) -> list[str]:
    """Execution x<i> prints i."""
    for index in indexes:
        # Exactly once is the point, not speed: cold fallbacks on a busy node may start slowly.
        create(
            objects,
            namespace,
            f"x{index}",
            language="python",
            source=f"print({index})",
            timeoutSeconds=60,
        )
    return [f"x{index}" for index in indexes]


def all_ended(objects: client.CustomObjectsApi, namespace: str, names: list[str]) -> bool:
    return all(
        status(get(objects, namespace, name) or {}).get("phase") in TERMINAL for name in names
    )


def audit(
    objects: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    names: list[str],
    *,
    operator_killed: bool = False,
) -> Counter[str]:
    """Every execution ended once with its own output: the start modes."""
    wait_until(
        lambda: all_ended(objects, namespace, names),
        timeout=BATCH_TIMEOUT,
        what=f"{len(names)} executions to end",
        interval=1,
    )
    statuses = {name: status(get(objects, namespace, name) or {}) for name in names}
    problems = [
        f"{name}: {s.get('phase')} {s.get('reason')} {s.get('stdout')!r}"
        for index, (name, s) in enumerate(statuses.items())
        if s.get("phase") != "Succeeded" or s.get("stdout") != f"{index}\n"
    ]
    for name in names:
        ends = [
            e for e in events_about(core, namespace, "CodeExecution", name) if e.reason in TERMINAL
        ]
        # Events are best effort: one still queued in an operator killed with -9 is lost.
        allowed = {0, 1} if operator_killed else {1}
        if sum(e.count or 1 for e in ends) not in allowed:
            problems.append(f"{name}: {len(ends)} terminal events")
    assert not problems, "\n".join(problems[:20])
    return Counter(str(s.get("startMode")) for s in statuses.values())


def test_fifty_executions_through_a_pool_of_four(
    warm_namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    start_pool(custom_objects, warm_namespace, 4)
    pods = {pod.metadata.name for pod in pods_in_state(core_v1, warm_namespace, POOL, "free")}
    names = run_batch(custom_objects, warm_namespace, range(50))
    modes = audit(custom_objects, core_v1, warm_namespace, names)
    assert set(modes) <= {"warm", "cold"}, modes
    warm = [
        status(get(custom_objects, warm_namespace, name) or {}).get("podName")
        for name in names
        if status(get(custom_objects, warm_namespace, name) or {}).get("startMode") == "warm"
    ]
    # The pool's own pods served them, many each (a pod serves 100 runs).
    assert len(warm) >= 40 and set(warm) <= pods, (modes, Counter(warm))
    assert pool_counts(custom_objects, warm_namespace, POOL) == (4, 4)


def test_operator_killed_while_pool_pods_serve_runs(
    operator_running: Deployed,
    warm_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
) -> None:
    start_pool(custom_objects, warm_namespace, 4)
    names = run_batch(custom_objects, warm_namespace, range(12))
    wait_until(
        lambda: any(
            status(get(custom_objects, warm_namespace, name) or {}).get("startMode") == "warm"
            for name in names
        ),
        timeout=60,
        what="a run to start in a pool pod",
        interval=0.1,
    )
    operator_running.kill()
    try:
        names += run_batch(custom_objects, warm_namespace, range(12, 24))
    finally:
        operator_running.start()
    audit(custom_objects, core_v1, warm_namespace, names, operator_killed=True)


def test_a_drained_pool_falls_back_to_cold(
    warm_namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    start_pool(custom_objects, warm_namespace, 1, maxRefillPerMinute=1, runsPerSandbox=1)
    names = run_batch(custom_objects, warm_namespace, range(3))
    modes = audit(custom_objects, core_v1, warm_namespace, names)
    assert modes["warm"] == 1 and modes["cold"] == 2, modes


def test_an_execution_larger_than_the_pool_goes_cold(
    warm_namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    start_pool(custom_objects, warm_namespace, 1, resources={"memory": "256Mi"})
    create(
        custom_objects,
        warm_namespace,
        "big",
        language="python",
        source="print(0)",
        resources={"memory": "512Mi"},
    )
    done = status(wait_for(custom_objects, warm_namespace, "big"))
    assert (done["phase"], done["startMode"]) == ("Succeeded", "cold")
    assert len(pods_in_state(core_v1, warm_namespace, POOL, "free")) == 1


HELLO = {
    "go": 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello from a pool") }\n',
    "csharp": "class Hello { static void Main() {\n"
    '  System.Console.WriteLine("hello from a pool");\n} }\n',
}
BROKEN = {
    "go": "package main\n\nfunc main() { undefinedThing() }\n",
    "csharp": "class Broken { static void Main() { undefinedThing(); } }\n",
}


@pytest.mark.parametrize("language", ["go", "csharp"])
def test_a_pool_of_a_compiled_language_builds_each_program_in_its_pod(
    language: str,
    warm_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
) -> None:
    """Its pod starts nothing ahead; a taken one builds the run's source, as a cold run
    does, and runs it; a build that fails is CompilationError with the compiler's output."""
    start_pool(custom_objects, warm_namespace, 1, name=language, language=language)
    create(custom_objects, warm_namespace, "hello", language=language, source=HELLO[language])
    done = status(wait_for(custom_objects, warm_namespace, "hello"))
    assert (done["phase"], done["startMode"], done.get("stdout")) == (
        "Succeeded",
        "warm",
        "hello from a pool\n",
    ), done
    wait_for_refill(core_v1, warm_namespace, language, done["podName"])
    create(custom_objects, warm_namespace, "broken", language=language, source=BROKEN[language])
    broken = status(wait_for(custom_objects, warm_namespace, "broken"))
    assert (broken["phase"], broken["reason"], broken["startMode"]) == (
        "Failed",
        "CompilationError",
        "warm",
    ), broken
    assert "undefinedThing" in broken.get("compileOutput", ""), broken
    assert not broken.get("stdout"), broken
    assert done["podName"] != broken["podName"]
