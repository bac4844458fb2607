"""The operator end to end: CodeExecutions on the real cluster, with the real sandbox images.

The operator runs as a local process (`sandpod_operator` fixture, cluster_fixtures.py) against the
cluster in KUBECONFIG; each test gets a fresh namespace. Waits poll with deadlines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_release import Deployed
from executions import (
    RUN_TIMEOUT,
    TERMINAL,
    conditions,
    create,
    create_refused,
    events_about,
    get,
    kubectl,
    manifest,
    pod_gone,
    run_to_end,
    status,
    wait_for,
)
from kubernetes import client
from release_settings import MISSING_IMAGE_LANGUAGE, MISSING_RUNTIME_CLASS
from sandpod_contract.quantities import parse_quantity
from sandpod_testkit.kube import GROUP, PLURAL, VERSION
from sandpod_testkit.waiting import WaitTimeout, wait_until

pytestmark = pytest.mark.usefixtures("sandpod_operator")


# --- success in every language -----------------------------------------------------------------

PROGRAMS = {
    "python": "import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)\n",
    "javascript": "console.log([1, 2, 3].reduce((a, b) => a + b) + 39);\n",
    "typescript": "const n: number = 6 * 7;\nconsole.log(`${n}`);\n",
    "bash": 'echo "$((40 + 2))"\necho args: "$@"\n',
}
EXPECTED_STDOUT = {
    "python": "45\n",
    "javascript": "45\n",
    "typescript": "42\n",
    "bash": "42\nargs: a b\n",
}


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_success(
    language: str,
    namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
) -> None:
    extra = {"args": ["a", "b"]} if language == "bash" else {}
    created = create(
        custom_objects, namespace, "hello", language=language, source=PROGRAMS[language], **extra
    )
    assert created["spec"]["timeoutSeconds"] == 10  # defaulted by the API server
    done = wait_for(custom_objects, namespace, "hello")
    st = status(done)
    assert st["phase"] == "Succeeded", st
    assert st["reason"] == "Completed"
    assert st["exitCode"] == 0
    assert st["stdout"] == EXPECTED_STDOUT[language]
    assert st["stdoutTruncated"] is False and st["stderrTruncated"] is False
    if language == "python":
        assert st["stderr"] == "warn\n"
    assert st["durationMs"] >= 0
    assert st["startedAt"] <= st["finishedAt"]
    assert st["observedGeneration"] == done["metadata"]["generation"]
    conds = conditions(done)
    assert conds["Completed"]["status"] == "True"
    assert conds["Succeeded"]["status"] == "True"
    assert conds["Started"]["status"] == "True"
    # The result is recorded, so the pod is removed; the phase transitions left Events.
    wait_until(pod_gone(core_v1, namespace, st["podName"]), timeout=30, what="the pod to go")
    reasons = {e.reason for e in events_about(core_v1, namespace, "CodeExecution", "hello")}
    assert "Succeeded" in reasons


def test_nonzero_exit_keeps_stderr(namespace: str, custom_objects: client.CustomObjectsApi) -> None:
    source = "import sys\nprint('partial')\nprint('boom', file=sys.stderr)\nsys.exit(3)\n"
    st = run_to_end(custom_objects, namespace, "fails", language="python", source=source)
    assert (st["phase"], st["reason"], st["exitCode"]) == ("Failed", "NonZeroExit", 3)
    assert st["stdout"] == "partial\n"
    assert st["stderr"] == "boom\n"
    assert st["retryable"] is False
    assert (
        conditions(wait_for(custom_objects, namespace, "fails"))["Succeeded"]["status"] == "False"
    )


def test_stdin_and_files(namespace: str, custom_objects: client.CustomObjectsApi) -> None:
    source = "import sys\nprint(sys.stdin.read().upper(), open('data/in.txt').read())\n"
    st = run_to_end(
        custom_objects,
        namespace,
        "io",
        language="python",
        source=source,
        stdin="abc",
        files=[{"path": "data/in.txt", "content": "xyz"}],
    )
    assert st["phase"] == "Succeeded", st
    assert st["stdout"] == "ABC xyz\n"


def test_large_output_keeps_the_tail(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    # 1.2 MB in one write: 100,000 lines of 12 bytes.
    source = "import sys\nsys.stdout.write(''.join(f'line {i:06d}\\n' for i in range(100_000)))\n"
    st = run_to_end(
        custom_objects,
        namespace,
        "chatty",
        language="python",
        source=source,
        maxOutputBytes=512 * 1024,
        timeoutSeconds=60,
    )
    assert st["phase"] == "Succeeded", st
    assert st["stdoutTruncated"] is True
    # The runner keeps the first 512 KiB (43,690 whole lines); status keeps their last 64 KiB.
    assert len(st["stdout"].encode()) <= 64 * 1024
    assert "line 043689\n" in st["stdout"][-64:]
    assert "line 000000" not in st["stdout"] and "line 050000" not in st["stdout"]


def test_timeout(namespace: str, custom_objects: client.CustomObjectsApi) -> None:
    st = run_to_end(
        custom_objects,
        namespace,
        "spins",
        language="python",
        source="print('start', flush=True)\nwhile True:\n    pass\n",
        timeoutSeconds=2,
    )
    assert (st["phase"], st["reason"]) == ("TimedOut", "DeadlineExceeded"), st
    assert st["stdout"] == "start\n"
    assert st["durationMs"] >= 2000


def test_memory_over_the_limit_is_oom_killed(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    source = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    st = run_to_end(
        custom_objects,
        namespace,
        "hungry",
        language="python",
        source=source,
        resources={"memory": "128Mi"},
        timeoutSeconds=30,
    )
    assert (st["phase"], st["reason"]) == ("Failed", "OOMKilled"), st
    assert "128Mi" in st["message"]


def test_lint_mode_reports_diagnostics(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    st = run_to_end(
        custom_objects, namespace, "lint", language="python", mode="lint", source="import os\n"
    )
    assert st["phase"] == "Succeeded", st
    assert [d["code"] for d in st["diagnostics"]] == ["F401"]


# --- the sandbox cannot run: Error quickly, never Pending forever ---------------------------------


def test_missing_runtime_class(namespace: str, custom_objects: client.CustomObjectsApi) -> None:
    create(
        custom_objects,
        namespace,
        "no-runtime",
        language="python",
        source="print(1)",
        runtimeClassName=MISSING_RUNTIME_CLASS,
    )
    done = wait_for(custom_objects, namespace, "no-runtime", timeout=20)
    st = status(done)
    assert (st["phase"], st["reason"], st["retryable"]) == ("Error", "RuntimeClassNotFound", False)
    assert MISSING_RUNTIME_CLASS in st["message"]
    assert conditions(done)["Accepted"]["status"] == "False"


def test_missing_image(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    create(custom_objects, namespace, "no-image", language=MISSING_IMAGE_LANGUAGE, source="true")
    st = status(wait_for(custom_objects, namespace, "no-image", timeout=45))
    assert (st["phase"], st["reason"]) == ("Error", "ImageNotFound"), st
    assert "does-not-exist" in st["message"]
    wait_until(pod_gone(core_v1, namespace, st["podName"]), timeout=30, what="the pod to go")


def test_unschedulable(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    node: Any = core_v1.list_node().items[0]
    allocatable = int(parse_quantity(node.status.allocatable["memory"]))
    too_much = f"{allocatable // 2**30 + 2}Gi"  # within the CRD's 64Gi bound, beyond the node
    create(
        custom_objects,
        namespace,
        "too-big",
        language="python",
        source="print(1)",
        resources={"memory": too_much},
    )
    st = status(wait_for(custom_objects, namespace, "too-big", timeout=30))
    # Larger than the node: it could never run, so it ends at once rather than queueing.
    assert (st["phase"], st["reason"], st["retryable"]) == ("Error", "Unschedulable", False), st
    assert "more than any node has" in st["message"] and "memory" in st["message"].lower()


QUEUE_BATCH = 100


def test_more_executions_than_the_node_holds_queue_and_all_finish(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    """100 at once, each asking 512Mi (about twice what the node can hold): the rest wait in
    Pending/Queued until room frees, and every one ends Succeeded, once."""
    names = [f"queued-{i:03d}" for i in range(QUEUE_BATCH)]
    for name in names:
        create(
            custom_objects,
            namespace,
            name,
            language="bash",
            source="sleep 1; echo ok",
            resources={"memory": "512Mi", "cpu": "100m"},
            # 45 gVisor sandboxes starting at once on 2 cores are slow: time is not the point.
            timeoutSeconds=120,
        )

    def all_finished() -> list[Any] | None:
        items = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        done = [i for i in items["items"] if (i.get("status") or {}).get("phase") in TERMINAL]
        return items["items"] if len(done) == QUEUE_BATCH else None

    finished = wait_until(all_finished, timeout=900, interval=2, what="all 100 to finish")
    failed = [
        f"{e['metadata']['name']}: {status(e)['phase']}/{status(e).get('reason')} "
        f"{status(e).get('message')}"
        for e in finished
        if (status(e)["phase"], status(e).get("stdout")) != ("Succeeded", "ok\n")
    ]
    assert not failed, "\n".join(failed[:10])
    queued = [e for e in finished if "Queued" in conditions(e)]
    assert queued, "some executions waited for room on the node"
    assert len({status(e)["podName"] for e in finished}) == QUEUE_BATCH


# --- refused by the API server itself ----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"timeoutSeconds": 0}, "spec.timeoutSeconds"),
        ({"timeoutSeconds": 3600}, "spec.timeoutSeconds"),
        ({"resources": {"memory": "1Ti"}}, "spec.resources.memory"),
        ({"resources": {"cpu": "lots"}}, "spec.resources.cpu"),
        ({"files": [{"path": "../escape", "content": ""}]}, "spec.files[0].path"),
        ({"language": "Python!"}, "spec.language"),
        ({"mode": "compile"}, "spec.mode"),
        ({"maxOutputBytes": 10}, "spec.maxOutputBytes"),
        ({"network": {"egress": "allowlist"}}, "network.allow"),
    ],
)
def test_invalid_spec_is_refused_by_kubectl_apply(
    change: dict[str, Any],
    field: str,
    namespace: str,
    kubeconfig_path: Path,
    custom_objects: client.CustomObjectsApi,
) -> None:
    body = manifest("bad", {"language": "python", "source": "print(1)", **change})
    result = kubectl(
        kubeconfig_path, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body)
    )
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
    assert get(custom_objects, namespace, "bad") is None


def test_bad_name_and_spec_changes_are_refused(
    namespace: str, kubeconfig_path: Path, custom_objects: client.CustomObjectsApi
) -> None:
    dotted = manifest("a.b", {"language": "python", "source": "print(1)"})
    result = kubectl(
        kubeconfig_path, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(dotted)
    )
    assert result.returncode != 0 and "metadata.name" in result.stderr, result.stderr

    create(custom_objects, namespace, "fixed", language="python", source="print(1)")
    changed = manifest("fixed", {"language": "python", "source": "print(2)"})
    result = kubectl(
        kubeconfig_path, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(changed)
    )
    assert result.returncode != 0
    assert "spec is immutable" in result.stderr, result.stderr


def test_explain_describes_fields(kubeconfig_path: Path, sandpod_crd: str) -> None:
    def explained() -> str | None:
        result = kubectl(kubeconfig_path, "explain", "codeexecution.spec.timeoutSeconds")
        return result.stdout if result.returncode == 0 else None

    text = wait_until(explained, timeout=30, what="kubectl explain to know CodeExecution")
    assert "Wall-clock limit" in text


# --- lifecycle: deletion, cancel, TTL ------------------------------------------------------------


def test_deleting_a_running_execution_removes_its_pod(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    create(
        custom_objects, namespace, "long", language="bash", source="sleep 60", timeoutSeconds=120
    )
    running = wait_for(custom_objects, namespace, "long", phases={"Running"})
    pod_name = status(running)["podName"]
    custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "long")
    wait_until(pod_gone(core_v1, namespace, pod_name), timeout=10, what="the pod to go")
    wait_until(
        lambda: get(custom_objects, namespace, "long") is None,
        timeout=10,
        what="the execution to go",
    )


def test_cancel(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    create(
        custom_objects, namespace, "stop-me", language="bash", source="sleep 60", timeoutSeconds=120
    )
    running = wait_for(custom_objects, namespace, "stop-me", phases={"Running"})
    custom_objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "stop-me",
        {"metadata": {"annotations": {"sandpod.dev/cancel": "true"}}},
    )
    st = status(wait_for(custom_objects, namespace, "stop-me", timeout=15))
    assert (st["phase"], st["reason"]) == ("Cancelled", "Cancelled")
    wait_until(
        pod_gone(core_v1, namespace, status(running)["podName"]), timeout=10, what="the pod to go"
    )


def test_finished_executions_expire_after_their_ttl(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    create(
        custom_objects,
        namespace,
        "brief",
        language="bash",
        source="echo hi",
        ttlSecondsAfterFinished=3,
    )
    done = wait_for(custom_objects, namespace, "brief")
    assert status(done)["phase"] == "Succeeded"
    kept = create(custom_objects, namespace, "kept", language="bash", source="echo hi")
    wait_until(
        lambda: get(custom_objects, namespace, "brief") is None,
        timeout=30,
        what="the execution to expire",
    )
    assert status(wait_for(custom_objects, namespace, "kept"))["phase"] == "Succeeded"
    assert get(custom_objects, namespace, "kept") is not None, kept


def test_pod_deleted_behind_the_operators_back_is_lost_not_rerun(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    create(
        custom_objects,
        namespace,
        "orphaned",
        language="bash",
        source="sleep 60",
        timeoutSeconds=120,
    )
    pod_name = status(wait_for(custom_objects, namespace, "orphaned", phases={"Running"}))[
        "podName"
    ]
    core_v1.delete_namespaced_pod(pod_name, namespace)
    st = status(wait_for(custom_objects, namespace, "orphaned", timeout=30))
    assert (st["phase"], st["reason"], st["retryable"]) == ("Error", "PodLost", True), st
    wait_until(pod_gone(core_v1, namespace, pod_name), timeout=30, what="the pod to go")
    with pytest.raises(client.ApiException):
        core_v1.read_namespaced_pod(pod_name, namespace)


# --- network: none by default, an allowlist when asked -------------------------------------------

NETWORK_PROBE = """
import socket, sys
try:
    socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443)
    print("dns")
except OSError:
    print("no-dns")
for host, port in [tuple(a.split(":")) for a in sys.argv[1:]]:
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print("open", host)
    except OSError:
        print("blocked", host)
"""


def api_server_addresses(core: client.CoreV1Api) -> list[tuple[str, int]]:
    """The API server as pods see it: its service address and its endpoint."""
    service: Any = core.read_namespaced_service("kubernetes", "default")
    addresses = [(service.spec.cluster_ip, 443)]
    endpoints: Any = core.read_namespaced_endpoints("kubernetes", "default")
    for subset in endpoints.subsets or []:
        for address in subset.addresses or []:
            addresses.extend((address.ip, port.port) for port in subset.ports or [])
    return addresses


def test_sandbox_has_no_network_by_default(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    targets = [f"{ip}:{port}" for ip, port in api_server_addresses(core_v1)]
    st = run_to_end(
        custom_objects, namespace, "offline", language="python", source=NETWORK_PROBE, args=targets
    )
    assert st["phase"] == "Succeeded", st
    lines = st["stdout"].splitlines()
    assert lines[0] == "no-dns"
    assert all(line.startswith("blocked") for line in lines[1:]), lines


def test_egress_allowlist_naming_the_cluster_is_refused(
    namespace: str, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    """The chart's admission policy refuses it at create, naming the rule; nothing runs.
    (Without the policy the operator refuses it itself: tests/e2e/test_chart_settings.py. An
    allowlist that opens a host: tests/hostile/test_egress_bounds.py, with its fake host.)"""
    addresses = api_server_addresses(core_v1)
    allow = [{"cidr": f"{ip}/32", "ports": [{"port": port}]} for ip, port in addresses]
    message = create_refused(
        custom_objects,
        namespace,
        "online",
        language="python",
        source=NETWORK_PROBE,
        args=[f"{ip}:{port}" for ip, port in addresses],
        network={"egress": "allowlist", "allow": allow},
    )
    assert f"spec.network.allow: {allow[0]['cidr']} " in message, message
    assert "egress rule " in message, message
    assert not core_v1.list_namespaced_pod(namespace).items


# --- the operator dies mid-batch ----------------------------------------------------------------


def pod_states(pods: list[Any]) -> list[str]:
    """Each pod's name, phase, conditions and containers' states: what a timeout reports."""
    return [
        f"{p.metadata.name} {p.status.phase} "
        f"{[(c.type, c.status, c.reason) for c in p.status.conditions or []]} "
        f"{[s.state.to_dict() for s in p.status.container_statuses or []]}"
        for p in pods
    ]


def test_operator_killed_mid_batch_loses_nothing_and_runs_nothing_twice(
    namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    operator_running: Deployed,
) -> None:
    names = [f"batch-{i}" for i in range(10)]

    def submit(index: int) -> None:
        source = f"import time\ntime.sleep(2)\nprint('done {index}')\n"
        create(custom_objects, namespace, names[index], language="python", source=source)

    def sandbox_pods() -> list[Any]:
        return list(core_v1.list_namespaced_pod(namespace).items)

    for index in range(5):
        submit(index)
    wait_until(sandbox_pods, timeout=RUN_TIMEOUT, what="the first sandbox pods")
    operator_running.kill()
    try:
        # While the operator is down, half the batch arrives and the running pods finish:
        # their results wait in the pods, the new executions wait for a pod.
        for index in range(5, 10):
            submit(index)
        try:
            wait_until(
                lambda: any(p.status.phase == "Succeeded" for p in sandbox_pods()),
                timeout=3 * RUN_TIMEOUT,
                what="a pod to finish while the operator is down",
            )
        except WaitTimeout as timeout:
            raise AssertionError(f"{timeout}; the pods: {pod_states(sandbox_pods())}") from None
    finally:
        operator_running.start()

    for i, name in enumerate(names):
        st = status(wait_for(custom_objects, namespace, name, timeout=2 * RUN_TIMEOUT))
        assert st["phase"] == "Succeeded", (name, st, operator_running.log_tail())
        assert st["stdout"] == f"done {i}\n"
        # Exactly one pod ever ran for it: the scheduler placed one pod uid under its name.
        scheduled = [
            e
            for e in events_about(core_v1, namespace, "Pod", st["podName"])
            if e.reason == "Scheduled"
        ]
        assert len({e.involved_object.uid for e in scheduled}) == 1, (name, scheduled)
        # And it was declared finished once.
        finished = [
            e
            for e in events_about(core_v1, namespace, "CodeExecution", name)
            if e.reason == "Succeeded"
        ]
        assert sum(e.count or 1 for e in finished) <= 1, (name, finished)
