"""The bench's session sections (pure parts): manifests, one session per client, the audit
of the sessions' own counts, the breakdown's milestones, the targets and the report."""

import threading

import pytest
from sandpod_bench.breakdown import SESSION_MILESTONE_NAMES, SESSION_SLICE_NAMES, slices
from sandpod_bench.main import parse_options
from sandpod_bench.manifests import code_execution, code_session
from sandpod_bench.recorder import Observation
from sandpod_bench.report import render, targets
from sandpod_bench.session import (
    PerClient,
    count_mismatches,
    executions_by_session,
    versions_seen,
)
from sandpod_bench.workloads import Attempt, Workload
from sandpod_contract.models import CodeExecutionSpec, CodeSessionSpec


def test_an_execution_in_a_session_names_it_and_validates() -> None:
    manifest = code_execution("run-1", namespace="ns", session="s1")
    assert manifest["spec"]["session"] == "s1"
    assert CodeExecutionSpec.model_validate(manifest["spec"]).session == "s1"
    assert "session" not in code_execution("run-2")["spec"]


def test_the_code_session_manifest_validates() -> None:
    manifest = code_session("bench-kubectl")
    assert manifest["kind"] == "CodeSession"
    assert manifest["metadata"]["name"] == "bench-kubectl"
    assert CodeSessionSpec.model_validate(manifest["spec"]).language == "python"


def test_each_client_keeps_a_workload_of_its_own() -> None:
    def workload(tag: str) -> Workload:
        return lambda index: Attempt(True, 0.0, f"{tag}-{index}")

    per_client = PerClient([workload("a"), workload("b")])
    seen: dict[str, set[str]] = {}
    lock = threading.Lock()
    both_running = threading.Barrier(2)

    def client(label: str) -> None:
        both_running.wait(timeout=10)
        for index in range(3):
            tag = per_client(index).name.split("-")[0]
            with lock:
                seen.setdefault(label, set()).add(tag)

    threads = [threading.Thread(target=client, args=(label,)) for label in ("x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(tag for tags in seen.values() for tag in tags) == ["a", "b"]
    assert all(len(tags) == 1 for tags in seen.values())


def test_more_clients_than_workloads_is_an_error() -> None:
    per_client = PerClient([])
    with pytest.raises(RuntimeError):
        per_client(0)


def in_session(name: str, session: str | None) -> Observation:
    seen = Observation("ns", name)
    seen.execution = {"spec": {"session": session} if session else {}}
    return seen


def test_the_sessions_own_counts_are_checked_against_the_executions_seen() -> None:
    observations = [
        in_session("a", "s1"),
        in_session("b", "s1"),
        in_session("c", "s2"),
        in_session("d", None),
    ]
    seen = executions_by_session(observations)
    assert seen == {"s1": 2, "s2": 1}
    assert count_mismatches(seen, {"s1": 2, "s2": 1}) == {}
    assert count_mismatches(seen, {"s1": 3, "s2": None, "s3": 0}) == {
        "s1": (2, 3),
        "s2": (1, None),
    }


def test_a_session_run_slices_from_submit_to_the_client() -> None:
    timeline = {
        "submitted": 100.0,
        "created": 100.01,
        "operator_seen": 100.02,
        "running": 100.03,
        "status_written": 100.07,
        "client_returned": 100.075,
    }
    parts = slices(timeline, SESSION_MILESTONE_NAMES, SESSION_SLICE_NAMES)
    assert [p.milestone for p in parts] == [
        "created",
        "operator_seen",
        "running",
        "status_written",
        "client_returned",
    ]
    assert sum(p.seconds for p in parts) == pytest.approx(0.075)
    assert not any(p.estimated for p in parts)


def test_session_options_have_full_and_quick_defaults() -> None:
    full = parse_options([])
    quick = parse_options(["--quick"])
    assert (full.session_runs, full.session_clients) == (200, 16)
    assert (quick.session_runs, quick.session_clients) == (30, 4)
    assert "session" in full.sections and "session-throughput" in full.sections


def latency(p50: float) -> dict[str, object]:
    return {
        "label": "print(1) in a session via gateway",
        "concurrency": 1,
        "summary": {"count": 30, "failures": 0, "p50": p50, "p95": p50, "p99": p50, "mean": p50},
    }


def throughput(rate: float, lost: int = 0) -> dict[str, object]:
    return {
        "path": "gateway, a session per client",
        "concurrency": 16,
        "window_seconds": 20.0,
        "executions_per_second": rate,
        "requests": 500,
        "succeeded": 500,
        "failed": 0,
        "lost": lost,
        "duplicated": 0,
        "latency": {"p50": 0.3, "p95": 0.5, "p99": 0.6},
    }


def test_targets_say_what_was_met() -> None:
    met = targets(
        {
            "session_latency": {"session_gateway_sequential": latency(0.012)},
            "session_throughput": throughput(120.0),
            "latency": {"pool_gateway_sequential": latency(0.05)},
            "ratios_p50": {"pod": {"gateway_sequential": 1.05}},
            "session_writes": {"session_gateway_sequential": writes(2.0)},
        }
    )
    assert met == [
        "target: session print(1) via the gateway p50 <= 15 ms: 12 ms, met",
        "target: session print(1) via the gateway p99 <= 50 ms: 12 ms, met",
        "target: >= 100 runs/s across 16 sessions, none lost, duplicated or failed: 120.0/s, met",
        "target: pool print(1) via the gateway p50 <= 60 ms: 50 ms, met",
        "target: cold print(1) via the gateway <= 1.1x a bare pod (p50): 1.05x, met",
        "target: <= 2 API writes of the records (CodeExecutions) per run "
        "(session_gateway_sequential): 2.00, met",
    ]
    missed = targets(
        {
            "session_latency": {"session_gateway_sequential": latency(0.08)},
            "session_throughput": throughput(120.0, lost=1),
            "latency": {"pool_gateway_sequential": latency(0.2)},
            "ratios_p50": {"pod": {"gateway_sequential": 1.5}},
            "session_writes": {"session_mcp_sequential": writes(3.5)},
        }
    )
    assert len(missed) == 6
    assert all(line.endswith("not met") for line in missed)
    assert targets({}) == []


def test_the_writes_target_reads_the_watch_when_it_counted() -> None:
    """The API server's counter has the whole cluster's CodeExecutions in it; the bench's
    watch only those of its namespace."""
    noisy = {**writes(2.4), "records_seen_per_run": 2.0}
    assert targets({"session_writes": {"session_mcp_sequential": noisy}}) == [
        "target: <= 2 API writes of the records (CodeExecutions) per run "
        "(session_mcp_sequential): 2.00, met"
    ]


def test_the_writes_a_watch_saw_are_the_versions_of_the_named_runs() -> None:
    created, finished, other = (
        Observation("ns", "a"),
        Observation("ns", "b"),
        Observation("ns", "c"),
    )
    created.versions = {"10"}
    finished.versions = {"11", "12"}
    other.versions = {"13", "14", "15"}  # not one of the runs
    assert versions_seen([created, finished, other], ["a", "b", ""]) == 3


def test_the_record_path_has_no_writes_target() -> None:
    assert targets({"session_writes": {"session_kubectl_sequential": writes(12.0)}}) == []


def writes(records_per_run: float) -> dict[str, object]:
    return {
        "runs": 200,
        "writes": int(200 * (records_per_run + 0.6)),
        "per_run": records_per_run + 0.6,
        "sandpod_per_run": records_per_run + 0.1,
        "records_per_run": records_per_run,
        "by_kind": {"POST sandpod.dev/codeexecutions": 1.0, "PUT leases": 0.5},
        "reads_per_run": 2.5,
        "sandpod_reads_by_kind": {"GET sandpod.dev/codesessions": 1.0},
    }


def test_render_shows_the_session_sections() -> None:
    slices_ = [{"name": "status write", "median_seconds": 0.02, "share": 0.5, "estimated_runs": 0}]
    text = render(
        {
            "session_latency": {"session_gateway_sequential": latency(0.04)},
            "session_throughput": throughput(25.0),
            "session_breakdown": {
                "session kubectl": {"slices": slices_, "total_seconds": 0.04, "largest": "x"}
            },
            "direct_breakdown": {
                "session gateway": {
                    "slices": slices_,
                    "total_seconds": 0.04,
                    "largest": "x",
                    "example": {"kubernetes_timestamps": {"execution.status.durationMs": 3}},
                }
            },
            "session_writes": {"session_gateway_sequential": writes(2.0)},
        }
    )
    for expected in (
        "print(1) in a session",
        "throughput in sessions",
        "where a session run goes",
        "where a direct run's time goes",
        "the runner's own durationMs of the median run: session gateway 3 ms",
        "0.020 (50%)",
        "25.00",
        "40 ms, not met",
        "session_gateway_sequential                       200    2.60         2.10     2.00     -"
        "   2.50",
        "  POST sandpod.dev/codeexecutions                       1.00",
        "  GET sandpod.dev/codesessions" + " " * 61 + "1.00",
        "other activity included; seen: the records' writes as the bench's watch",
    ):
        assert expected in text
