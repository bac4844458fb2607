"""Section `baselines`: the same print(1) as a Kubernetes Job, a bare pod and llm-sandbox's
one-off, on the pod spec of a sandbox sandpod made; and sandpod's latency over theirs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from sandpod_bench import manifests
from sandpod_bench.bench import Bench, breakdown_entry
from sandpod_bench.cluster import progress
from sandpod_bench.recorder import Recorder
from sandpod_bench.report import baseline_ratios
from sandpod_bench.workloads import BarePod, JobBaseline, LlmSandbox, Workload, run_many


def ensure_baseline_policy(bench: Bench) -> None:
    """The baselines' deny-all NetworkPolicy (the same enforcer work as for sandboxes)."""
    namespace = bench.namespaces.baselines
    policies: Any = client.NetworkingV1Api(bench.api)
    try:
        policies.create_namespaced_network_policy(
            namespace, manifests.baseline_network_policy(namespace)
        )
    except client.ApiException as error:
        if error.status != 409:
            raise


def run(bench: Bench, model_recorder: Recorder) -> None:
    """Each of --baselines, sequential; `model_recorder` watches the namespace where the
    sandbox pod the baselines copy is made."""
    options = bench.options
    namespace = bench.namespaces.baselines
    ensure_baseline_policy(bench)
    sandbox, catalog, core = bench.sandbox_pod(model_recorder), bench.catalog, bench.core
    batch = client.BatchV1Api(bench.api)
    candidates: dict[str, tuple[str, Callable[[str], Workload]]] = {
        "job": (
            "Kubernetes Job (create → Complete, log)",
            lambda prefix: JobBaseline(batch, core, namespace, sandbox, catalog, prefix),
        ),
        "pod": (
            "bare pod (create → container exited, log)",
            lambda prefix: BarePod(core, namespace, sandbox, catalog, prefix, bench.containerd),
        ),
        "llm-sandbox": (
            "llm-sandbox, Kubernetes backend (open, run)",
            lambda prefix: LlmSandbox(core, namespace, sandbox, catalog),
        ),
    }
    for key in options.baselines:
        label, make = candidates[key]
        warm = run_many(make(f"{key}-warm"), runs=1, concurrency=1)[0]
        if not warm.ok:
            progress(f"{label}: the warm-up failed: {warm.error}")
        attempts = bench.measure(
            key,
            label,
            f"baseline-{key}",
            make(f"{key}-run"),
            runs=options.baseline_runs,
            concurrency=1,
        )
        if key == "pod" and (entry := breakdown_entry(None, attempts)):
            bench.results.setdefault("breakdown", {})["bare pod"] = entry


def record_ratios(bench: Bench) -> None:
    """sandpod's latency against the baselines' (when both were measured)."""
    if bench.results.get("latency"):
        for statistic in ("p50", "p95"):
            bench.results[f"ratios_{statistic}"] = baseline_ratios(
                bench.results["latency"],
                bench.results.get("baselines") or {},
                statistic,
            )
