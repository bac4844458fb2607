"""The benchmark's accounting: throughput audit, operator cost, the proxy's request
classification, and the baselines' manifests (the same pod as sandpod's)."""

from typing import Any

import pytest
from sandpod_bench.cost import CostSample, cost_summary, counts_delta
from sandpod_bench.manifests import (
    BASELINE_LABEL,
    baseline_job,
    baseline_network_policy,
    baseline_pod,
    code_execution,
    llm_sandbox_pod,
)
from sandpod_bench.procstat import ProcessSample
from sandpod_bench.proxy import classify
from sandpod_bench.recorder import Observation
from sandpod_bench.throughput import Finished, audit
from sandpod_bench.workloads import Attempt, run_many
from sandpod_contract.catalog import load_catalog
from sandpod_contract.models import CodeExecutionSpec
from sandpod_operator.executions.builders import build_pod, plan_execution
from sandpod_operator.settings import OperatorSettings


def observation(name: str, phase: str | None, pods: int = 1) -> Observation:
    seen = Observation("ns", name)
    if phase:
        seen.execution = {"status": {"phase": phase}}
    seen.pod_names = {f"{name}-pod{i}" for i in range(pods)}
    return seen


def test_audit_counts_success_failure_loss_and_duplicates() -> None:
    finished = [
        Finished(Attempt(True, 3.0, "a"), at=10.0),
        Finished(Attempt(True, 3.0, "b"), at=130.0),  # after the window
        Finished(Attempt(False, 3.0, "c", "error: Unschedulable"), at=20.0),
        Finished(Attempt(False, 180.0, "d", "no terminal status"), at=50.0),
        Finished(Attempt(False, 0.1, "", "HTTP 429: too many"), at=5.0),
        Finished(Attempt(False, 30.0, "", "ReadTimeout: timed out"), at=60.0),
        Finished(Attempt(True, 3.0, "e"), at=70.0),
    ]
    observations = [
        observation("a", "Succeeded"),
        observation("b", "Succeeded"),
        observation("c", "Error"),
        observation("d", None),
        observation("e", "Succeeded", pods=2),  # ran twice
        observation("orphan", "Succeeded"),  # no client heard of it
    ]
    result = audit(finished, observations, window_seconds=120.0)
    assert result.requests == 7
    assert result.succeeded == 3
    assert result.succeeded_in_window == 2
    assert result.failed == 2  # c (answered Error) and the 429
    assert result.orphaned == 1
    assert result.lost == 3  # d, the read timeout, and the orphan
    assert result.unrecorded == 0
    assert result.duplicated == 1


def test_an_answered_run_whose_record_never_ends_is_lost() -> None:
    """A direct run is answered first and recorded behind: a record that never came, or never
    got its status, is a lost record."""
    finished = [
        Finished(Attempt(True, 0.04, "recorded"), 1.0),
        Finished(Attempt(True, 0.04, "never-written"), 2.0),
        Finished(Attempt(True, 0.04, "no-status"), 3.0),
    ]
    seen = [observation("recorded", "Succeeded"), observation("no-status", None)]
    result = audit(finished, seen, 10.0)
    assert (result.succeeded, result.unrecorded, result.lost) == (3, 2, 2)


def test_the_same_execution_returned_to_two_requests_is_a_duplicate() -> None:
    finished = [Finished(Attempt(True, 1.0, "a"), 1.0), Finished(Attempt(True, 1.0, "a"), 2.0)]
    assert audit(finished, [observation("a", "Succeeded")], 10.0).duplicated == 1


def test_cost_per_hundred_executions() -> None:
    before = CostSample(
        ProcessSample(cpu_seconds=10.0, rss_bytes=100 * 2**20, peak_rss_bytes=100 * 2**20),
        {"create pods": 10, "watch pods": 2},
        own=(100.0, 10.0),
    )
    after = CostSample(
        ProcessSample(cpu_seconds=12.5, rss_bytes=110 * 2**20, peak_rss_bytes=120 * 2**20),
        {"create pods": 60, "watch pods": 2, "patch codeexecutions/status": 150},
        own=(550.0, 60.0),
    )
    summary = cost_summary(50, before, after, seconds=25.0)
    assert summary["cpu_seconds_per_100_executions"] == pytest.approx(5.0)
    assert summary["cpu_cores_busy"] == pytest.approx(0.1)
    assert summary["rss_mib_growth_per_100_executions"] == pytest.approx(20.0)
    assert summary["peak_rss_mib"] == pytest.approx(120.0)
    assert summary["api_requests_per_execution"] == pytest.approx(4.0)
    assert summary["api_requests_per_execution_by_kind"] == {
        "create pods": 1.0,
        "patch codeexecutions/status": 3.0,
    }
    assert summary["operator_counted_requests_per_execution"] == pytest.approx(9.0)


def test_counts_delta_drops_what_did_not_move() -> None:
    assert counts_delta({"a": 1, "b": 2}, {"a": 1, "b": 5, "c": 1}) == {"b": 3, "c": 1}


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "true"}, ("watch", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", {}, ("get", "pods/log")),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", {}, ("delete", "pods")),
        ("POST", "/api/v1/namespaces/ns/events", {}, ("create", "events")),
        (
            "PATCH",
            "/apis/sandpod.dev/v1alpha1/namespaces/ns/codeexecutions/x/status",
            {},
            ("patch", "codeexecutions/status"),
        ),
        (
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            {"watch": "1"},
            ("watch", "customresourcedefinitions"),
        ),
        ("GET", "/api/v1/namespaces", {}, ("list", "namespaces")),
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "namespaces")),
        ("GET", "/apis", {}, ("get", "discovery")),
        ("GET", "/version", {}, ("get", "discovery")),
    ],
)
def test_the_proxy_names_requests_like_the_audit_log(
    method: str, path: str, query: dict[str, str], expected: tuple[str, str]
) -> None:
    assert classify(method, path, query) == expected


def sandbox_pod(settings: OperatorSettings) -> dict[str, Any]:
    """A sandbox pod as the operator builds it and the API server and scheduler fill it in."""
    spec = CodeExecutionSpec.model_validate(
        {"language": "python", "source": "print(1)", "timeoutSeconds": 10}
    )
    plan = plan_execution(spec, load_catalog(), settings)
    pod = build_pod(namespace="ns", execution_name="x", uid="u" * 8, plan=plan, settings=settings)
    pod["spec"] |= {"nodeName": "node-1", "priority": 0, "preemptionPolicy": "PreemptLowerPriority"}
    return pod


def test_baseline_pods_are_sandpods_sandbox_pod_without_the_runner() -> None:
    catalog, settings = load_catalog(), OperatorSettings()
    sandbox = sandbox_pod(settings)
    pod = baseline_pod(sandbox, namespace="ns", name="p", kind="pod", catalog=catalog)
    spec = pod["spec"]
    container = spec["containers"][0]
    assert spec["runtimeClassName"] == settings.runtime_class_name
    assert container["image"] == catalog.languages["python"].image
    assert container["command"] == ["python3", "-c", "print(1)"]
    assert container["resources"]["limits"]["cpu"] == settings.default_cpu
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert [v["name"] for v in spec["volumes"]] == ["tmp"]
    assert [m["name"] for m in container["volumeMounts"]] == ["tmp"]
    assert not {"nodeName", "priority", "preemptionPolicy"} & set(spec)
    assert pod["metadata"] == {
        "name": "p",
        "namespace": "ns",
        "labels": {"app.kubernetes.io/part-of": "sandpod-bench", BASELINE_LABEL: "pod"},
    }
    assert sandbox["spec"]["nodeName"] == "node-1"  # the model is left as it was
    # not a sandpod sandbox: the operator must not pick it up
    assert "sandpod.dev/execution" not in pod["metadata"]["labels"]


def test_the_job_and_llm_sandbox_pods_share_that_spec() -> None:
    catalog, settings = load_catalog(), OperatorSettings()
    sandbox = sandbox_pod(settings)
    job = baseline_job(sandbox, namespace="ns", name="j", catalog=catalog)
    template = job["spec"]["template"]
    assert template["spec"]["runtimeClassName"] == settings.runtime_class_name
    assert template["metadata"]["labels"][BASELINE_LABEL] == "job"
    assert job["spec"]["backoffLimit"] == 0
    session_pod = llm_sandbox_pod(sandbox, namespace="ns", catalog=catalog)
    container = session_pod["spec"]["containers"][0]
    assert container["command"][0] == "sh"
    assert {"name": "PATH", "value": "/tmp/bin:/usr/local/bin:/usr/bin:/bin"} in container["env"]


def test_the_baseline_policy_selects_every_baseline_pod_and_denies_all() -> None:
    policy = baseline_network_policy("ns")
    assert policy["spec"]["podSelector"]["matchExpressions"][0]["key"] == BASELINE_LABEL
    assert policy["spec"]["ingress"] == [] and policy["spec"]["egress"] == []


def test_the_code_execution_runs_print_one() -> None:
    manifest = code_execution("x", namespace="ns")
    assert manifest["spec"] == {"language": "python", "source": "print(1)", "timeoutSeconds": 10}
    assert manifest["metadata"]["namespace"] == "ns"


def test_run_many_keeps_order_and_turns_errors_into_failed_attempts() -> None:
    def workload(index: int) -> Attempt:
        if index == 2:
            raise RuntimeError("the cluster went away")
        return Attempt(True, float(index), str(index))

    for concurrency in (1, 3):
        attempts = run_many(workload, runs=4, concurrency=concurrency, think_seconds=0.01)
        assert [a.name for a in attempts] == ["0", "1", "", "3"]
        assert attempts[2].ok is False
        assert attempts[2].error == "RuntimeError: the cluster went away"
