"""`make bench`: runs the chosen sections against the cluster KUBECONFIG points at, prints the
report and writes benchmarks/results/<timestamp>.json and latest.json.

The bench starts its own operator (and, for the cost section, a second one behind a counting
proxy) and its own gateway, each scoped to the bench's namespaces (`bench-<id>-*`), and
removes everything it made when it ends, also when it fails. Each section is a module of
sandpod_bench.sections.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from sandpod_contract.catalog import load_catalog
from sandpod_testkit.kube import create_namespace, ensure_crd
from sandpod_testkit.paths import REPO_ROOT

from sandpod_bench import manifests
from sandpod_bench.bench import Bench, Recorders
from sandpod_bench.cluster import (
    BENCH_LABELS,
    Namespaces,
    api_server_answers,
    clean_up_leftovers,
    delete_namespaces,
    ensure_runtime_class,
    load_average,
    machine_facts,
    other_activity,
    progress,
)
from sandpod_bench.containerd import ContainerdEvents
from sandpod_bench.kube import connect
from sandpod_bench.options import POOL_SECTIONS, SESSION_SECTIONS, Options, parse_options
from sandpod_bench.procstat import ProcessSample
from sandpod_bench.report import render
from sandpod_bench.sections import (
    baselines,
    cost,
    e2b,
    judge0,
    latency,
    pool,
    session,
    soak,
    throughput,
)
from sandpod_bench.workloads import SandpodGateway

CONTAINERD_SOCKET = REPO_ROOT / ".cluster" / "run" / "containerd.sock"


def run_sections(bench: Bench) -> None:
    """The sections that need the main operator and the gateway, then the cost section
    (with an operator of its own)."""
    sections = bench.options.sections
    with ExitStack() as stack:
        recorders = Recorders(
            kubectl=bench.recorder(bench.namespaces.kubectl, stack),
            gateway=bench.recorder(bench.namespaces.gateway, stack),
            load=bench.recorder(bench.namespaces.load, stack),
            pool=bench.recorder(bench.namespaces.pool, stack),
            session=bench.recorder(bench.namespaces.session, stack),
            e2b=bench.recorder(bench.namespaces.e2b, stack),
        )
        # Runs before the recorders' own stops: all their watches wind down at once
        # (each blocks up to a watch call's length) instead of one after another.
        stack.callback(recorders.request_stop)
        operator, clients = bench.start_sandpod(stack)
        operator_start = operator.sample()
        if "latency" in sections:
            latency.run(bench, recorders, SandpodGateway(clients.gateway, recorders.gateway))
        if "baselines" in sections:
            baselines.run(bench, recorders.kubectl)
        if "throughput" in sections:
            bench.results["throughput"] = throughput.run(
                bench, bench.namespaces.load, clients.load, recorders.load, "cold"
            )
        # After the cold sections: the pool's sandboxes would share the node with them.
        if any(section in sections for section in POOL_SECTIONS):
            pool.run(bench, clients.pool, recorders.pool)
        if any(section in sections for section in SESSION_SECTIONS):
            session.run(bench, clients, recorders.session, recorders.kubectl)
        if "e2b" in sections:
            e2b.run(bench, clients, recorders.e2b)
        if "judge0" in sections:
            judge0.run(bench, clients.judge0_cold, clients.judge0_pool)
        if "soak" in sections:
            soak.run(bench, clients, operator)
        baselines.record_ratios(bench)
        record_main_operator(bench, operator_start, operator.sample(), recorders)
        progress("removing the executions (the operator releases them)")
    if "cost" in sections:
        cost.run(bench)


def record_main_operator(
    bench: Bench, start: ProcessSample, end: ProcessSample, recorders: Recorders
) -> None:
    """The main operator's CPU and memory over the executions it saw to the end."""
    handled = len(
        [
            observation
            for recorder in recorders.each()
            for observation in recorder.all()
            if observation.terminal
        ]
    )
    if handled:
        cpu = end.cpu_seconds - start.cpu_seconds
        bench.results["main_operator"] = {
            "executions": handled,
            "cpu_seconds": cpu,
            "cpu_seconds_per_100_executions": cpu / handled * 100,
            "rss_mib_end": end.rss_bytes / 1024 / 1024,
            "peak_rss_mib": end.peak_rss_bytes / 1024 / 1024,
        }


def write_results(results: dict[str, Any], output_dir: Path, stamp: str, *, latest: bool) -> Path:
    """<stamp>.json always; latest.json only for a run that completed."""
    output_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=2, sort_keys=False) + "\n"
    path = output_dir / f"{stamp}.json"
    path.write_text(text)
    if latest:
        (output_dir / "latest.json").write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    if not options.kubeconfig.is_file():
        print(
            f"no cluster: {options.kubeconfig} does not exist (make cluster-up, or set KUBECONFIG)",
            file=sys.stderr,
        )
        return 2
    if options.clean_up:
        removed = clean_up_leftovers(connect(options.kubeconfig, pool=4))
        print(f"removed: {', '.join(removed) or 'nothing'}")
        return 0
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    run_id = uuid.uuid4().hex[:6]
    namespaces = Namespaces(f"bench-{run_id}", soak="soak" in options.sections)
    log_dir = options.output_dir / "logs" / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    api = connect(options.kubeconfig, pool=max(32, options.throughput_concurrency * 2))
    if not api_server_answers(api, timeout=120):
        print(
            f"no cluster: the API server of {options.kubeconfig} does not answer", file=sys.stderr
        )
        return 2
    results = run_facts(options, api, log_dir, started)
    notes: list[str] = []
    note_other_activity(client.CoreV1Api(api), namespaces.prefix, results, notes)
    bench = Bench(
        options=options,
        api=api,
        namespaces=namespaces,
        catalog=load_catalog(),
        log_dir=log_dir,
        containerd=containerd_events(namespaces.prefix, notes),
        results=results,
        notes=notes,
    )
    progress(f"bench {namespaces.prefix}: logs in {log_dir}")
    failure = run_bench(bench)
    results["machine"]["load_after"] = load_average()
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["notes"] = notes
    if failure:
        results["failure"] = failure
    path = write_results(results, options.output_dir, stamp, latest=failure is None)
    print(render(results))
    print(f"\nresults: {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
    return 1 if failure else 0


def run_facts(
    options: Options,
    api: client.ApiClient,
    log_dir: Path,
    started: datetime,
) -> dict[str, Any]:
    """What the results say about the run before it starts: options, program, machine."""
    return {
        "started_at": started.isoformat(timespec="seconds"),
        "options": {
            key: (str(value) if isinstance(value, Path) else value)
            for key, value in asdict(options).items()
            if key not in ("kubeconfig", "output_dir")
        },
        "program": manifests.PROGRAM,
        "image": load_catalog().languages[manifests.LANGUAGE].image,
        "runtime_class": options.runtime_class,
        "machine": machine_facts(api),
        "logs": str(log_dir.relative_to(REPO_ROOT))
        if log_dir.is_relative_to(REPO_ROOT)
        else str(log_dir),
    }


def note_other_activity(
    core: client.CoreV1Api, prefix: str, results: dict[str, Any], notes: list[str]
) -> None:
    """The load and the other pods at the start (other people's tests make numbers noisy)."""
    results["machine"]["load_before"] = load_average()
    activity = other_activity(core, prefix)
    results["machine"]["other_activity_before"] = activity
    busy = os.getloadavg()[0] > 1.0 or activity["pods_outside_kube_system"] > 0
    if busy:
        notes.append(
            f"the machine was not quiet: load average {load_average()}, "
            f"{activity['pods_outside_kube_system']} other pods outside kube-system at the start"
        )


def containerd_events(prefix: str, notes: list[str]) -> ContainerdEvents | None:
    """containerd's event stream for the bench's pods, started; None (and a note) without
    ctr or the local cluster's socket."""
    ctr = shutil.which("ctr")
    if ctr and CONTAINERD_SOCKET.exists():
        containerd = ContainerdEvents(ctr, CONTAINERD_SOCKET, prefix)
        containerd.start()
        return containerd
    notes.append(
        "no containerd event stream (ctr or the socket missing): the sandbox and "
        "container milestones are folded into 'kubelet reports the exit'"
    )
    return None


def run_bench(bench: Bench) -> str | None:
    """Prepares the cluster, runs the bench and removes its namespaces; the failure, if any
    (the partial results are still written and printed)."""
    core = bench.core
    namespaces = [*bench.namespaces.sandpod, bench.namespaces.baselines, bench.namespaces.cost]
    failure: str | None = None
    try:
        ensure_crd(bench.api, timeout=60)
        ensure_runtime_class(bench.api, bench.options.runtime_class)
        for namespace in namespaces:
            # On a busy cluster the controller manager is slow to make the service account.
            create_namespace(core, namespace, labels=BENCH_LABELS, timeout=300)
        run_sections(bench)
    except Exception as error:
        failure = f"{type(error).__name__}: {error}"
        progress(f"the bench failed: {failure}")
        traceback.print_exc()
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        delete_namespaces(core, namespaces)
        if bench.containerd is not None:
            bench.containerd.stop()
    return failure
