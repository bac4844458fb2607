"""Section `latency`: print(1) one-off (cold), sequential and concurrent, via kubectl and via
the gateway, and where the time of the sequential runs goes."""

from __future__ import annotations

from sandpod_bench.bench import Bench, Recorders, breakdown_entry
from sandpod_bench.cluster import progress
from sandpod_bench.recorder import Recorder
from sandpod_bench.workloads import SandpodGateway, SandpodKubectl


def kubectl_workload(bench: Bench, recorder: Recorder, prefix: str) -> SandpodKubectl:
    options = bench.options
    namespace = bench.namespaces.kubectl
    return SandpodKubectl(options.kubectl, options.kubeconfig, namespace, recorder, prefix)


def run(bench: Bench, recorders: Recorders, gateway_workload: SandpodGateway) -> None:
    """Sequential and concurrent runs via kubectl and via the gateway, and the time
    breakdown of the sequential ones."""
    runs, concurrency = bench.options.runs, bench.options.concurrency
    progress("warming up")
    bench.warm("sandpod via kubectl", kubectl_workload(bench, recorders.kubectl, "warm"))
    bench.warm("sandpod via the gateway", gateway_workload)
    sequential_kubectl = bench.measure(
        "kubectl_sequential",
        "sandpod via kubectl apply, sequential",
        "sandpod-kubectl",
        kubectl_workload(bench, recorders.kubectl, "seq"),
        runs=runs,
        concurrency=1,
    )
    bench.measure(
        f"kubectl_concurrency_{concurrency}",
        f"sandpod via kubectl apply, concurrency {concurrency}",
        "sandpod-kubectl",
        kubectl_workload(bench, recorders.kubectl, "conc"),
        runs=runs,
        concurrency=concurrency,
    )
    sequential_gateway = bench.measure(
        "gateway_sequential",
        "sandpod via the gateway, sequential",
        "sandpod-gateway",
        gateway_workload,
        runs=runs,
        concurrency=1,
    )
    bench.measure(
        f"gateway_concurrency_{concurrency}",
        f"sandpod via the gateway, concurrency {concurrency}",
        "sandpod-gateway",
        gateway_workload,
        runs=runs,
        concurrency=concurrency,
    )
    breakdown = {}
    for path, recorder, attempts in (
        ("kubectl", recorders.kubectl, sequential_kubectl),
        ("gateway", recorders.gateway, sequential_gateway),
    ):
        entry = breakdown_entry(recorder, attempts)
        if entry:
            breakdown[path] = entry
    bench.results.setdefault("breakdown", {}).update(breakdown)
