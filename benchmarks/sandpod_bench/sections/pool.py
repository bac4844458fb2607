"""Sections `pool` and `pool-throughput`: a SandboxPool in its own namespace, filled before
each measurement; print(1) through the gateway (the direct path: a free pool pod taken by the
operator at once) and through kubectl (the record path: a pool pod claimed for the
CodeExecution), sequential, with where the warm time goes; and throughput into the pool's
namespace."""

from __future__ import annotations

import httpx

from sandpod_bench.bench import Bench, breakdown_entry, ran_warm, start_modes
from sandpod_bench.cluster import progress
from sandpod_bench.pool import create_pool, wait_pool_full
from sandpod_bench.recorder import Recorder
from sandpod_bench.sections import throughput
from sandpod_bench.stats import summarize
from sandpod_bench.throughput import settle
from sandpod_bench.timings import direct_marks, operator_marks
from sandpod_bench.workloads import SandpodGateway, SandpodKubectl

# Filling the pool boots `--pool-size` gVisor sandboxes at once on a busy node.
POOL_FILL_SECONDS = 300
# The records of direct runs are written behind the answers.
RECORDS_SETTLE_SECONDS = 30


def fill_pool(bench: Bench) -> None:
    if not wait_pool_full(bench.custom, bench.namespaces.pool, POOL_FILL_SECONDS):
        bench.notes.append(f"the pool was not full after {POOL_FILL_SECONDS} s")


def run(bench: Bench, http: httpx.Client, recorder: Recorder) -> None:
    """The pool sections: sequential print(1) and the warm breakdowns ('pool'), and
    throughput ('pool-throughput')."""
    options, namespace = bench.options, bench.namespaces.pool
    progress(f"pool: a SandboxPool of {options.pool_size} in {namespace}, filling")
    create_pool(bench.custom, namespace, options.pool_size)
    fill_pool(bench)
    if "pool" in options.sections:
        run_latency(bench, http, recorder)
    if "pool-throughput" in options.sections:
        fill_pool(bench)
        bench.results["pool_throughput"] = throughput.run(bench, namespace, http, recorder, "pool")


def run_latency(bench: Bench, http: httpx.Client, recorder: Recorder) -> None:
    options, namespace = bench.options, bench.namespaces.pool
    gateway = SandpodGateway(http, recorder)
    bench.warm("the gateway from a pool", gateway)
    bench.warm(
        "kubectl from a pool",
        SandpodKubectl(options.kubectl, options.kubeconfig, namespace, recorder, "pool-warm"),
    )
    measured = {}
    for path, label, workload in (
        ("gateway", "sandpod via the gateway from a pool, sequential", gateway),
        (
            "kubectl",
            "sandpod via kubectl apply from a pool, sequential",
            SandpodKubectl(options.kubectl, options.kubeconfig, namespace, recorder, "pool"),
        ),
    ):
        fill_pool(bench)
        key = f"pool_{path}_sequential"
        attempts = bench.measure(
            key, label, f"sandpod-pool-{path}", workload, runs=options.runs, concurrency=1
        )
        names = [a.name for a in attempts if a.name]
        settle(recorder, RECORDS_SETTLE_SECONDS, names)  # a direct run's record comes behind
        modes = start_modes(recorder, names)
        warm = summarize([a.seconds for a in attempts if a.ok and ran_warm(recorder, a.name)])
        entry = bench.results["latency"][key]
        entry["start_modes"] = modes
        entry["warm_only"] = warm.as_dict() if warm else None
        progress(f"  started {modes}; warm runs only: p50 {f'{warm.p50:.3f}s' if warm else '-'}")
        measured[path] = attempts
    operator_log = bench.log_dir / "operator.log"
    # kubectl's runs take the record path (the operator's warm timings); the gateway's the
    # direct path (its direct timings), divided with the other direct runs.
    entry = breakdown_entry(recorder, measured["kubectl"], "warm", operator_marks(operator_log))
    bench.results["pool_breakdown"] = {"pool kubectl": entry} if entry else {}
    entry = breakdown_entry(recorder, measured["gateway"], "direct", direct_marks(operator_log))
    if entry:
        bench.results.setdefault("direct_breakdown", {})["pool gateway"] = entry
