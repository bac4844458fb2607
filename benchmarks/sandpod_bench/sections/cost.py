"""Section `cost`: what the operator spends per execution (CPU, memory, API requests), with an
operator of its own behind a counting proxy, on executions created through the API."""

from __future__ import annotations

import time
from contextlib import ExitStack

import yaml

from sandpod_bench.bench import Bench
from sandpod_bench.cluster import BenchError, progress, running
from sandpod_bench.cost import CostSample, cost_summary, wait_quiet
from sandpod_bench.processes import ProxyProcess
from sandpod_bench.proxy import proxy_kubeconfig
from sandpod_bench.workloads import SandpodApi, run_many


def run(bench: Bench) -> None:
    options = bench.options
    namespace = bench.namespaces.cost
    progress(f"operator cost: {options.cost_executions} executions through a counting proxy")
    with ExitStack() as stack:
        proxy = ProxyProcess(kubeconfig=options.kubeconfig, log_path=bench.log_dir / "proxy.log")
        stack.enter_context(running(proxy))
        proxied = bench.log_dir / "proxy.kubeconfig"
        proxied.write_text(yaml.safe_dump(proxy_kubeconfig(proxy.port)))
        operator = bench.start_operator(stack, proxied, [namespace], "operator-cost.log")
        recorder = bench.recorder(namespace, stack)
        warm = run_many(
            SandpodApi(bench.custom, namespace, recorder, "warm"), runs=2, concurrency=1
        )
        if not all(a.ok for a in warm):
            raise BenchError(f"warm-up of the cost section failed: {warm[0].error}")
        if not wait_quiet(proxy.counts, quiet_seconds=3, timeout=60):
            bench.notes.append("the operator never went quiet before the cost measurement")
        before = CostSample(operator.sample(), proxy.counts(), operator.own_requests())
        started = time.perf_counter()
        attempts = run_many(
            SandpodApi(bench.custom, namespace, recorder, "cost"),
            runs=options.cost_executions,
            concurrency=options.cost_concurrency,
        )
        if not wait_quiet(proxy.counts, quiet_seconds=3, timeout=60):
            bench.notes.append("the operator never went quiet after the cost measurement")
        seconds = time.perf_counter() - started
        after = CostSample(operator.sample(), proxy.counts(), operator.own_requests())
        summary = cost_summary(options.cost_executions, before, after, seconds)
        summary["concurrency"] = options.cost_concurrency
        summary["failures"] = sum(1 for a in attempts if not a.ok)
        bench.results["operator_cost"] = summary
        progress(
            f"  {summary['cpu_seconds_per_100_executions']:.1f} CPU s per 100, "
            f"{summary['api_requests_per_execution']:.1f} API requests per execution"
        )
        progress("removing the cost section's executions")
