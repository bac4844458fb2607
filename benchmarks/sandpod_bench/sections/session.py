"""Sections `session` and `session-throughput`, in their own namespace (no pool: the sessions
start cold, and are waited for until Ready before anything is timed): print(1) in a session
through the gateway and through MCP (the direct path), through kubectl (the record path) and
in llm-sandbox's own session, back to back (no kubelet clock to dodge), each with the API
writes per run and where the time goes ('session'); throughput across --session-clients
sessions ('session-throughput')."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sandpod_bench.apiserver import read_requests, writes_per_run
from sandpod_bench.bench import Bench, GatewayClients, breakdown_entry
from sandpod_bench.cluster import progress
from sandpod_bench.recorder import Recorder
from sandpod_bench.sections.baselines import ensure_baseline_policy
from sandpod_bench.session import (
    PerClient,
    SessionNotReady,
    count_mismatches,
    create_session,
    execution_counts,
    executions_by_session,
    open_through_gateway,
    versions_seen,
    wait_ready,
)
from sandpod_bench.throughput import measure as measure_throughput
from sandpod_bench.throughput import settle
from sandpod_bench.timings import direct_marks
from sandpod_bench.workloads import (
    Attempt,
    LlmSandboxSession,
    McpSession,
    SandpodGateway,
    SandpodKubectl,
    Workload,
)

# A cold session boots one gVisor sandbox; sixteen at once on a busy node take longer.
SESSION_START_SECONDS = 300
# The records of direct runs are written behind the answers, the sessions' counts after them.
RECORDS_SETTLE_SECONDS = 30
COUNTS_SETTLE_SECONDS = 10


def run(bench: Bench, clients: GatewayClients, recorder: Recorder, model: Recorder) -> None:
    """`model` watches the namespace where the sandbox pod llm-sandbox's copies is made."""
    if "session" in bench.options.sections:
        run_latency(bench, clients, recorder)
        run_llm_sandbox_session(bench, model)
    if "session-throughput" in bench.options.sections:
        bench.results["session_throughput"] = run_throughput(bench, clients, recorder)


def counted_writes(
    bench: Bench, recorder: Recorder, sessions: Sequence[str], measure: Callable[[], list[str]]
) -> dict[str, Any] | None:
    """The API server's writes while `measure` ran its runs (it answers their names, "" for
    a run that got none), once their records and the sessions' counts are written, per
    run."""
    before = read_requests(bench.api)
    names = measure()
    settle(recorder, RECORDS_SETTLE_SECONDS, [name for name in names if name])
    session_count_mismatches(bench, recorder, sessions)
    writes = writes_per_run(before, read_requests(bench.api), len(names))
    if writes is None:
        return None
    seen = versions_seen(recorder.all(), names) / len(names)
    progress(
        f"  API writes per run {writes.per_run:.2f} (sandpod's {writes.sandpod_per_run:.2f}, "
        f"the records' as the watch saw them {seen:.2f})"
    )
    return {**writes.as_dict(), "records_seen_per_run": seen}


def run_latency(bench: Bench, clients: GatewayClients, recorder: Recorder) -> None:
    options, namespace = bench.options, bench.namespaces.session
    progress(f"sessions in {namespace}: two through the gateway (HTTP, MCP), one as a CodeSession")
    via_gateway, via_mcp = ready_sessions(bench, lambda: open_through_gateway(clients.session), 2)
    [via_kubectl] = ready_sessions(
        bench, lambda: create_session(bench.custom, namespace, f"bench-{uuid.uuid4().hex[:8]}"), 1
    )
    gateway = SandpodGateway(clients.session, recorder, f"/v1/sessions/{via_gateway}/executions")
    mcp = McpSession(clients.url, clients.session_key, via_mcp)
    kubectl = SandpodKubectl(
        options.kubectl, options.kubeconfig, namespace, recorder, "sess", via_kubectl
    )
    mcp.open()
    try:
        bench.warm("a session via the gateway", gateway)
        bench.warm("a session via MCP", mcp)
        bench.warm(
            "a session via kubectl",
            SandpodKubectl(
                options.kubectl, options.kubeconfig, namespace, recorder, "warm", via_kubectl
            ),
        )
        measured: dict[str, list[Attempt]] = {}
        writes: dict[str, Any] = {}
        for path, session, workload in (
            ("gateway", via_gateway, gateway),
            ("mcp", via_mcp, mcp),
            ("kubectl", via_kubectl, kubectl),
        ):
            key = f"session_{path}_sequential"

            def measure(
                path: str = path, workload: Workload = workload, key: str = key
            ) -> list[str]:
                measured[path] = bench.measure(
                    key,
                    f"print(1) in a session via {path}, sequential",
                    f"sandpod-session-{path}",
                    workload,
                    runs=options.session_runs,
                    concurrency=1,
                    group="session_latency",
                    think_seconds=0,
                )
                return [attempt.name for attempt in measured[path]]

            writes[key] = counted_writes(bench, recorder, [session], measure)
    finally:
        mcp.close()
    bench.results["session_writes"] = writes
    entry = breakdown_entry(recorder, measured["kubectl"], "session")
    bench.results["session_breakdown"] = {"session kubectl": entry} if entry else {}
    marks = direct_marks(bench.log_dir / "operator.log")
    for path in ("gateway", "mcp"):
        entry = breakdown_entry(recorder, measured[path], "direct", marks)
        if entry:
            bench.results.setdefault("direct_breakdown", {})[f"session {path}"] = entry


def run_llm_sandbox_session(bench: Bench, model: Recorder) -> None:
    """llm-sandbox's own session on the baselines' pod spec: opened once, then print(1)
    in it back to back."""
    namespace = bench.namespaces.baselines
    ensure_baseline_policy(bench)
    workload = LlmSandboxSession(bench.core, namespace, bench.sandbox_pod(model), bench.catalog)
    progress("llm-sandbox: opening its session")
    workload.open()
    try:
        bench.warm("llm-sandbox's session", workload)
        bench.measure(
            "llm_sandbox_session",
            "llm-sandbox's own session (run in its open pod)",
            "baseline-llm-sandbox-session",
            workload,
            runs=bench.options.session_runs,
            concurrency=1,
            group="session_latency",
            think_seconds=0,
        )
    finally:
        workload.close()


def ready_sessions(bench: Bench, open_one: Callable[[], str], count: int) -> list[str]:
    """`count` sessions opened at once and waited for until Ready; one that ends while
    starting (StartupTimeout on a busy node) is replaced, at most `count` times, with a
    note."""
    waiting = [open_one() for _ in range(count)]
    ready: list[str] = []
    replaced = 0
    while waiting:
        name = waiting.pop(0)
        try:
            wait_ready(bench.custom, bench.namespaces.session, name, SESSION_START_SECONDS)
        except SessionNotReady as error:
            if replaced >= count:
                raise
            replaced += 1
            bench.notes.append(f"a session did not start ({error}); opened another")
            waiting.append(open_one())
            continue
        ready.append(name)
    return ready


def run_throughput(bench: Bench, clients: GatewayClients, recorder: Recorder) -> dict[str, Any]:
    """--session-clients closed-loop clients through the gateway, each in a session of
    its own, audited as the other throughputs, each session's own executionCount checked
    against the executions seen naming it, and the API writes per run."""
    options = bench.options
    progress(f"session throughput: opening {options.session_clients} sessions")
    names = ready_sessions(
        bench, lambda: open_through_gateway(clients.session), options.session_clients
    )
    workloads = [
        SandpodGateway(clients.session, recorder, f"/v1/sessions/{name}/executions")
        for name in names
    ]
    for index, workload in enumerate(workloads):
        bench.warm(f"session {index} of the throughput", workload)
    progress(
        f"throughput (sessions): {options.session_clients} clients, one session each, "
        f"via the gateway for {options.duration:.0f}s"
    )
    throughput: dict[str, Any] = {}
    attempts: list[Attempt] = []

    def measure() -> list[str]:
        earlier = {observation.name for observation in recorder.all()}
        summary, finished = measure_throughput(
            PerClient(workloads),
            recorder,
            path="gateway, a session per client",
            concurrency=options.session_clients,
            duration_seconds=options.duration,
        )
        throughput.update(summary)
        attempts.extend(finished)
        return [o.name for o in recorder.all() if o.name not in earlier]

    throughput["api_writes"] = counted_writes(bench, recorder, names, measure)
    # Where the time of a run goes under that load.
    entry = breakdown_entry(
        recorder, attempts, "direct", direct_marks(bench.log_dir / "operator.log")
    )
    if entry:
        bench.results.setdefault("direct_breakdown", {})["session throughput"] = entry
    mismatches = session_count_mismatches(bench, recorder, names)
    throughput["session_count_mismatches"] = {k: list(v) for k, v in mismatches.items()}
    progress(
        f"  {throughput['executions_per_second']:.2f}/s, lost {throughput['lost']}, "
        f"duplicated {throughput['duplicated']}, failed {throughput['failed']}, "
        f"sessions whose count disagrees {len(mismatches)}"
    )
    return throughput


def session_count_mismatches(
    bench: Bench, recorder: Recorder, names: Sequence[str]
) -> dict[str, tuple[int, int | None]]:
    """The sessions write their count after the execution's status: allow them 10 s."""
    deadline = time.monotonic() + COUNTS_SETTLE_SECONDS
    while True:
        seen = executions_by_session(recorder.all())
        mismatches = count_mismatches(
            seen, execution_counts(bench.custom, bench.namespaces.session, names)
        )
        if not mismatches or time.monotonic() > deadline:
            return mismatches
        time.sleep(0.5)
