"""Section `throughput` (and the pool's): closed-loop clients into one namespace for
--duration seconds, audited (failed, lost, duplicated), with how the executions started."""

from __future__ import annotations

from typing import Any

import httpx

from sandpod_bench.bench import Bench, start_modes
from sandpod_bench.cluster import progress
from sandpod_bench.recorder import Recorder
from sandpod_bench.throughput import measure as measure_throughput
from sandpod_bench.workloads import SandpodApi, SandpodGateway, SandpodKubectl, Workload


def run(
    bench: Bench, namespace: str, http: httpx.Client, recorder: Recorder, what: str
) -> dict[str, Any]:
    """Closed-loop clients into `namespace` (cold: no pool there; or the pool's), audited;
    with how the executions started."""
    options = bench.options
    prefix = f"load-{what}"
    workloads: dict[str, Workload] = {
        "gateway": SandpodGateway(http, recorder),
        "api": SandpodApi(bench.custom, namespace, recorder, prefix),
        "kubectl": SandpodKubectl(options.kubectl, options.kubeconfig, namespace, recorder, prefix),
    }
    workload = workloads[options.throughput_path]
    bench.warm(f"the {what} throughput path", workload)
    earlier = {observation.name for observation in recorder.all()}
    progress(
        f"throughput ({what}): {options.throughput_concurrency} clients via "
        f"{options.throughput_path} for {options.duration:.0f}s"
    )
    throughput, _ = measure_throughput(
        workload,
        recorder,
        path=options.throughput_path,
        concurrency=options.throughput_concurrency,
        duration_seconds=options.duration,
    )
    names = [o.name for o in recorder.all() if o.name not in earlier]
    throughput["start_modes"] = start_modes(recorder, names)
    progress(
        f"  {throughput['executions_per_second']:.2f}/s, lost {throughput['lost']}, "
        f"duplicated {throughput['duplicated']}, failed {throughput['failed']}, "
        f"started {throughput['start_modes']}"
    )
    return throughput
