"""`make bench`: runs every section against the cluster KUBECONFIG points at, prints the
report and writes benchmarks/results/<timestamp>.json and latest.json.

The bench starts its own operator (and, for the cost section, a second one behind a counting
proxy) and its own gateway, each scoped to the bench's namespaces (`bench-<id>-*`), and
removes everything it made when it ends, also when it fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import secrets
import shutil
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from sandpod_contract.catalog import Catalog, load_catalog
from sandpod_contract.names import GROUP, PLURAL, POOL_PLURAL, SESSION_PLURAL, VERSION
from sandpod_operator.settings import OperatorSettings
from sandpod_testkit.kube import create_namespace, ensure_crd
from sandpod_testkit.paths import REPO_ROOT, default_kubeconfig, kube_bin_dir
from urllib3.exceptions import HTTPError

from sandpod_bench import manifests
from sandpod_bench.breakdown import (
    MILESTONE_NAMES,
    SESSION_MILESTONE_NAMES,
    SESSION_SLICE_NAMES,
    SLICE_NAMES,
    WARM_MILESTONE_NAMES,
    WARM_SLICE_NAMES,
    kubernetes_timestamps,
    largest,
    slices,
    summarize_slices,
)
from sandpod_bench.containerd import ContainerdEvents
from sandpod_bench.cost import cost_summary, wait_quiet
from sandpod_bench.kube import connect, list_raw
from sandpod_bench.pool import create_pool, node_address, operator_marks, wait_pool_full
from sandpod_bench.processes import GatewayProcess, OperatorProcess, ProxyProcess
from sandpod_bench.procstat import ProcessSample
from sandpod_bench.proxy import proxy_kubeconfig
from sandpod_bench.recorder import FINALIZER, Recorder
from sandpod_bench.report import baseline_ratios, render
from sandpod_bench.session import (
    PerClient,
    SessionNotReady,
    count_mismatches,
    create_session,
    execution_counts,
    executions_by_session,
    open_through_gateway,
    wait_ready,
)
from sandpod_bench.stats import median, summarize
from sandpod_bench.throughput import measure as measure_throughput
from sandpod_bench.workloads import (
    RUN_TIMEOUT_SECONDS,
    Attempt,
    BarePod,
    JobBaseline,
    LlmSandbox,
    LlmSandboxSession,
    SandpodApi,
    SandpodGateway,
    SandpodKubectl,
    Workload,
    run_many,
)

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
CONTAINERD_SOCKET = REPO_ROOT / ".cluster" / "run" / "containerd.sock"
KEYS_SECRET = "bench-api-keys"
# The bench tenants' request rate and burst: far above what the benchmarks send.
BENCH_REQUESTS_PER_SECOND = 10000
SECTIONS = (
    "latency",
    "baselines",
    "throughput",
    "pool",
    "pool-throughput",
    "session",
    "session-throughput",
    "cost",
)
POOL_SECTIONS = ("pool", "pool-throughput")
SESSION_SECTIONS = ("session", "session-throughput")
# A cold session boots one gVisor sandbox; eight at once on a busy node take longer.
SESSION_START_SECONDS = 300
# Filling the pool boots `--pool-size` gVisor sandboxes at once on a busy node.
POOL_FILL_SECONDS = 300
BASELINES = ("job", "pod", "llm-sandbox")
CLEANUP_SECONDS = 180
BENCH_LABELS = {manifests.PART_OF_LABEL: manifests.PART_OF}
# What carries the operator's finalizer: executions, pools and sessions.
FINALIZED_PLURALS = (PLURAL, POOL_PLURAL, SESSION_PLURAL)


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Options:
    runs: int
    concurrency: int
    baseline_runs: int
    throughput_concurrency: int
    duration: float
    throughput_path: str
    think_time: float
    cost_executions: int
    cost_concurrency: int
    pool_size: int
    session_runs: int
    session_clients: int
    sections: tuple[str, ...]
    baselines: tuple[str, ...]
    quick: bool
    clean_up: bool
    kubeconfig: Path
    kubectl: str
    output_dir: Path


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="Latency, throughput, baselines, time breakdown and operator cost of "
        "sandpod on the cluster KUBECONFIG points at.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: few runs, low concurrency, a short throughput window",
    )
    parser.add_argument("--runs", type=int, help="runs per latency measurement (default 50)")
    parser.add_argument(
        "--concurrency", type=int, help="concurrency of the concurrent latency runs (default 8)"
    )
    parser.add_argument("--baseline-runs", type=int, help="runs per baseline (default: --runs)")
    parser.add_argument("--throughput-concurrency", type=int, help="clients (default 16)")
    parser.add_argument("--duration", type=float, help="throughput window, seconds (default 120)")
    parser.add_argument(
        "--throughput-path",
        choices=("gateway", "api", "kubectl"),
        default="gateway",
        help="how throughput clients submit (default gateway)",
    )
    parser.add_argument(
        "--think-time",
        type=float,
        default=1.0,
        help="latency clients pause a random 0..this many seconds before each run, so that "
        "runs do not start in step with the kubelet's 1 s relist (default 1; 0: back to back)",
    )
    parser.add_argument(
        "--cost-executions",
        type=int,
        help="executions measured for the operator's cost (default 100)",
    )
    parser.add_argument("--cost-concurrency", type=int, help="their concurrency (default 8)")
    parser.add_argument(
        "--pool-size",
        type=int,
        help="ready sandboxes in the SandboxPool of the pool sections (default 8)",
    )
    parser.add_argument(
        "--session-runs",
        type=int,
        help="runs per session latency measurement, back to back (default 200)",
    )
    parser.add_argument(
        "--session-clients",
        type=int,
        help="clients of the session throughput, each with its own session (default 8)",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} (the breakdowns come with latency "
        "and pool)",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma-separated subset of {','.join(BASELINES)}",
    )
    add_setup_arguments(parser)
    return parser


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the bench runs and writes, and its clean-up mode."""
    parser.add_argument("--kubeconfig", type=Path, default=default_kubeconfig())
    parser.add_argument("--kubectl", default=os.environ.get("KUBECTL") or default_kubectl())
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--clean-up",
        action="store_true",
        help="only remove what an interrupted bench left behind (its namespaces and their "
        "executions), then exit; not while another bench runs on the cluster",
    )


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argument_parser()
    arguments = parser.parse_args(argv)
    quick = bool(arguments.quick)

    def pick(value: Any, full: Any, smoke: Any) -> Any:
        return value if value is not None else (smoke if quick else full)

    runs = pick(arguments.runs, 50, 5)
    sections = tuple(s for s in arguments.sections.split(",") if s)
    baselines = tuple(b for b in arguments.baselines.split(",") if b)
    unknown = [s for s in sections if s not in SECTIONS] + [
        b for b in baselines if b not in BASELINES
    ]
    if unknown:
        parser.error(f"unknown section or baseline: {', '.join(unknown)}")
    return Options(
        runs=runs,
        concurrency=pick(arguments.concurrency, 8, 2),
        baseline_runs=pick(arguments.baseline_runs, runs, min(runs, 3)),
        throughput_concurrency=pick(arguments.throughput_concurrency, 16, 4),
        duration=pick(arguments.duration, 120.0, 20.0),
        throughput_path=arguments.throughput_path,
        think_time=arguments.think_time,
        cost_executions=pick(arguments.cost_executions, 100, 10),
        cost_concurrency=pick(arguments.cost_concurrency, 8, 2),
        pool_size=pick(arguments.pool_size, 8, 4),
        session_runs=pick(arguments.session_runs, 200, 30),
        session_clients=arguments.session_clients or 8,
        sections=sections,
        baselines=baselines,
        quick=quick,
        clean_up=bool(arguments.clean_up),
        kubeconfig=arguments.kubeconfig,
        kubectl=arguments.kubectl,
        output_dir=arguments.output_dir,
    )


def default_kubectl() -> str:
    """The local cluster's kubectl (built with it), else the one on PATH."""
    bin_dir = kube_bin_dir()
    if bin_dir is not None and (bin_dir / "kubectl").exists():
        return str(bin_dir / "kubectl")
    return shutil.which("kubectl") or "kubectl"


def progress(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# --- machine and cluster --------------------------------------------------------------------


def machine_facts(api: client.ApiClient) -> dict[str, Any]:
    cpu_model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    version = client.VersionApi(api).get_code()
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "kubernetes": version.git_version,
        "python": platform.python_version(),
    }


def api_server_answers(api: client.ApiClient, timeout: float) -> bool:
    """Whether /version answers within `timeout` (other sessions may be restarting it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.VersionApi(api).get_code()
            return True
        except (client.ApiException, HTTPError):
            if time.monotonic() > deadline:
                return False
            progress("waiting for the API server")
            time.sleep(2)


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def other_activity(core: client.CoreV1Api, prefix: str) -> dict[str, int]:
    """What else runs on the cluster (other people's tests make the numbers noisy)."""
    pods = list_raw(core.list_pod_for_all_namespaces)["items"]
    others = [p["metadata"]["namespace"] for p in pods]
    others = [namespace for namespace in others if not namespace.startswith(prefix)]
    return {
        "pods": len(others),
        "pods_outside_kube_system": sum(1 for ns in others if ns != "kube-system"),
    }


def ensure_runtime_class(api: client.ApiClient, name: str) -> None:
    try:
        client.NodeV1Api(api).read_runtime_class(name)
    except client.ApiException as error:
        if error.status == 404:
            raise BenchError(f"the cluster has no RuntimeClass {name!r}") from error
        raise


# --- the bench's namespaces, processes and clean-up -----------------------------------------


@dataclass
class Namespaces:
    prefix: str

    @property
    def kubectl(self) -> str:
        return f"{self.prefix}-kubectl"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}-gateway"

    @property
    def load(self) -> str:
        return f"{self.prefix}-load"

    @property
    def baselines(self) -> str:
        return f"{self.prefix}-baselines"

    @property
    def cost(self) -> str:
        return f"{self.prefix}-cost"

    @property
    def pool(self) -> str:
        return f"{self.prefix}-pool"

    @property
    def session(self) -> str:
        return f"{self.prefix}-session"

    @property
    def sandpod(self) -> list[str]:
        """Those the main operator watches."""
        return [self.kubectl, self.gateway, self.load, self.pool, self.session]


def delete_executions(
    custom: client.CustomObjectsApi, namespaces: Sequence[str], operator: OperatorProcess
) -> None:
    """Delete every execution and pool while the operator still runs (it releases its
    finalizer); what is left when the operator is gone or after CLEANUP_SECONDS loses the
    finalizer by force. Survives an API server that is briefly away (other sessions restart
    it)."""
    deadline = time.monotonic() + CLEANUP_SECONDS
    requested: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        try:
            left = 0
            for namespace in namespaces:
                for plural in FINALIZED_PLURALS:
                    if (namespace, plural) not in requested:
                        custom.delete_collection_namespaced_custom_object(
                            GROUP, VERSION, namespace, plural
                        )
                        requested.add((namespace, plural))
                    listed: Any = custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural
                    )
                    left += len(listed["items"])
        except (client.ApiException, HTTPError) as error:
            progress(f"clean-up: the API server failed ({type(error).__name__}), retrying")
            time.sleep(2)
            continue
        if not left:
            return
        if not operator.alive():
            break
        time.sleep(1)
    release_finalizers(custom, namespaces)


def release_finalizers(custom: client.CustomObjectsApi, namespaces: Sequence[str]) -> None:
    """Remove the operator's finalizer from every execution and pool left in `namespaces`."""
    for namespace in namespaces:
        for plural in FINALIZED_PLURALS:
            try:
                remaining: Any = custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural
                )
                for item in remaining["items"]:
                    finalizers = [
                        f for f in item["metadata"].get("finalizers") or [] if f != FINALIZER
                    ]
                    custom.patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        namespace,
                        plural,
                        item["metadata"]["name"],
                        {"metadata": {"finalizers": finalizers or None}},
                    )
            except (client.ApiException, HTTPError) as error:
                progress(f"could not release the {plural} in {namespace}: {error}")


def delete_namespaces(core: client.CoreV1Api, namespaces: Sequence[str]) -> None:
    for namespace in namespaces:
        try:
            core.delete_namespace(namespace, propagation_policy="Background")
        except client.ApiException as error:
            if error.status != 404:
                progress(f"could not delete namespace {namespace}: {error.reason}")
        except HTTPError as error:
            progress(f"could not delete namespace {namespace}: {error}")


def clean_up_leftovers(api: client.ApiClient) -> list[str]:
    """Namespaces an interrupted bench left behind (labelled as the bench's): their
    executions lose the finalizer (no operator runs for them any more), then they go."""
    core = client.CoreV1Api(api)
    selector = f"{manifests.PART_OF_LABEL}={manifests.PART_OF}"
    names = [
        item["metadata"]["name"]
        for item in list_raw(core.list_namespace, label_selector=selector)["items"]
    ]
    release_finalizers(client.CustomObjectsApi(api), names)
    delete_namespaces(core, names)
    return names


@contextmanager
def running(process: Any) -> Iterator[Any]:
    process.start()
    try:
        yield process
    finally:
        process.stop()


def tenants_secret(tenants: dict[str, tuple[str, str]]) -> client.V1Secret:
    """The gateway's keys Secret: tenant -> (namespace, API key)."""
    document = {
        "tenants": {
            name: {
                "namespace": namespace,
                "limits": {
                    "maxTimeoutSeconds": 60,
                    "maxConcurrent": 256,
                    "maxSessions": 16,
                    "requestsPerSecond": BENCH_REQUESTS_PER_SECOND,
                    "requestBurst": BENCH_REQUESTS_PER_SECOND,
                },
                "apiKeys": [{"name": "bench", "sha256": hashlib.sha256(key.encode()).hexdigest()}],
            }
            for name, (namespace, key) in tenants.items()
        }
    }
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEYS_SECRET),
        string_data={"tenants.yaml": yaml.safe_dump(document)},
    )


# --- sections --------------------------------------------------------------------------------


def latency_entry(
    label: str, path: str, concurrency: int, attempts: Sequence[Attempt]
) -> dict[str, Any]:
    good = [a.seconds for a in attempts if a.ok]
    failures = [a for a in attempts if not a.ok]
    summary = summarize(good, failures=len(failures))
    errors = Counter(a.error for a in failures)
    return {
        "label": label,
        "path": path,
        "concurrency": concurrency,
        "runs": len(attempts),
        "failures": len(failures),
        "summary": summary.as_dict() if summary else None,
        "error": errors.most_common(1)[0][0] if errors else None,
        "errors": dict(errors.most_common(5)),
        "samples_seconds": [round(a.seconds, 4) for a in attempts if a.ok],
    }


def breakdown_entry(
    recorder: Recorder | None,
    attempts: Sequence[Attempt],
    warm_marks: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
    *,
    session: bool = False,
) -> dict[str, Any] | None:
    """Median slices over the successful attempts; milestones from the attempt itself and,
    for sandpod, from the recorder (watch events, containerd). With `warm_marks` (the
    operator's timing lines): the warm milestones, over the attempts that ran warm; with
    `session`: those of a run in a session."""
    names, slice_names = (
        (SESSION_MILESTONE_NAMES, SESSION_SLICE_NAMES)
        if session
        else (MILESTONE_NAMES, SLICE_NAMES)
        if warm_marks is None
        else (WARM_MILESTONE_NAMES, WARM_SLICE_NAMES)
    )
    runs = []
    details = []
    for attempt in attempts:
        if not attempt.ok or not attempt.name:
            continue
        recorded = recorder.timeline(attempt.name) if recorder else {}
        if warm_marks is not None:
            marks = warm_marks.get((recorder.namespace if recorder else "", attempt.name))
            if not marks:
                continue  # it went cold (or the operator logged no timings)
            recorded = {**recorded, **marks}
        timeline = {**recorded, **attempt.milestones}
        runs.append(slices(timeline, names, slice_names))
        details.append((attempt, timeline))
    if not runs:
        return None
    summaries = summarize_slices(runs)
    biggest = largest(summaries)
    # The run whose total is the median one, with Kubernetes' own timestamps beside it.
    totals = [attempt.seconds for attempt, _ in details]
    middle = median(totals)
    attempt, timeline = min(details, key=lambda item: abs(item[0].seconds - middle))
    observation = recorder.get(attempt.name) if recorder else None
    start = timeline["submitted"]
    return {
        "runs": len(runs),
        "slices": [asdict(s) for s in summaries],
        "total_seconds": sum(s.median_seconds for s in summaries),
        "largest": biggest.name if biggest else None,
        "example": {
            "name": attempt.name,
            "seconds": attempt.seconds,
            "milestones_seconds_after_submit": {
                name: round(timeline[name] - start, 4) for name in names if name in timeline
            },
            "kubernetes_timestamps": kubernetes_timestamps(
                observation.execution if observation else None,
                observation.pod if observation else None,
            ),
        },
    }


@dataclass(frozen=True)
class Recorders:
    """Watchers of the main operator's namespaces, one per way in."""

    kubectl: Recorder
    gateway: Recorder
    load: Recorder
    pool: Recorder
    session: Recorder

    def each(self) -> tuple[Recorder, ...]:
        return (self.kubectl, self.gateway, self.load, self.pool, self.session)

    def request_stop(self) -> None:
        for recorder in self.each():
            recorder.request_stop()


@dataclass(frozen=True)
class GatewayClients:
    """One gateway client per tenant: latency, load, pool, session."""

    gateway: httpx.Client
    load: httpx.Client
    pool: httpx.Client
    session: httpx.Client


def ran_warm(recorder: Recorder, name: str) -> bool:
    return start_modes(recorder, [name]) == {"warm": 1}


def start_modes(recorder: Recorder, names: Iterable[str]) -> dict[str, int]:
    """How the named executions started (warm: from the pool, cold), as their status says."""
    modes: Counter[str] = Counter()
    for name in names:
        observation = recorder.get(name)
        status = ((observation.execution if observation else None) or {}).get("status") or {}
        modes[str(status.get("startMode") or "unknown")] += 1
    return dict(modes)


def gateway_client(url: str, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=url,
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        timeout=httpx.Timeout(RUN_TIMEOUT_SECONDS + 30),
        headers={"Authorization": f"Bearer {key}"},
    )


@dataclass
class Bench:
    options: Options
    api: client.ApiClient
    namespaces: Namespaces
    catalog: Catalog
    settings: OperatorSettings
    log_dir: Path
    containerd: ContainerdEvents | None
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def recorder(self, namespace: str, stack: ExitStack) -> Recorder:
        recorder = Recorder(self.api, namespace, self.containerd)
        recorder.start()
        stack.callback(self._stop_recorder, recorder)
        return recorder

    def _stop_recorder(self, recorder: Recorder) -> None:
        recorder.stop()
        if recorder.outage_seconds:
            self.notes.append(
                f"the API server was unreachable for up to {recorder.outage_seconds:.0f} s "
                f"during the run (watching {recorder.namespace}): the numbers of that phase "
                "include the outage"
            )

    def warm(self, what: str, workload: Workload) -> None:
        attempt = run_many(workload, runs=1, concurrency=1)[0]
        if not attempt.ok:
            raise BenchError(f"warm-up of {what} failed: {attempt.error}")

    def measure(
        self,
        key: str,
        label: str,
        path: str,
        workload: Workload,
        *,
        runs: int,
        concurrency: int,
        group: str | None = None,
        think_seconds: float | None = None,
    ) -> list[Attempt]:
        """Latency entry `key` of results[group] (default: latency for sandpod, else
        baselines); think time `think_seconds` (default --think-time)."""
        progress(f"{label}: {runs} runs")
        attempts = run_many(
            workload,
            runs=runs,
            concurrency=concurrency,
            think_seconds=self.options.think_time if think_seconds is None else think_seconds,
        )
        entry = latency_entry(label, path, concurrency, attempts)
        summary = entry["summary"]
        progress(
            f"  p50 {summary['p50']:.2f}s p95 {summary['p95']:.2f}s, {entry['failures']} failed"
            if summary
            else f"  every run failed: {entry['error']}"
        )
        group = group or ("latency" if path.startswith("sandpod") else "baselines")
        self.results.setdefault(group, {})[key] = entry
        return attempts

    def run(self) -> None:
        """The sections that need the main operator and the gateway, then the cost section
        (with an operator of its own)."""
        sections = self.options.sections
        with ExitStack() as stack:
            recorders = Recorders(
                kubectl=self.recorder(self.namespaces.kubectl, stack),
                gateway=self.recorder(self.namespaces.gateway, stack),
                load=self.recorder(self.namespaces.load, stack),
                pool=self.recorder(self.namespaces.pool, stack),
                session=self.recorder(self.namespaces.session, stack),
            )
            # Runs before the recorders' own stops: all their watches wind down at once
            # (each blocks up to a watch call's length) instead of one after another.
            stack.callback(recorders.request_stop)
            operator, clients = self.start_sandpod(stack)
            operator_start = operator.sample()
            if "latency" in sections:
                self.run_latency(recorders, SandpodGateway(clients.gateway, recorders.gateway))
            if "baselines" in sections:
                self.run_baselines()
            if "throughput" in sections:
                self.results["throughput"] = self.run_throughput(
                    self.namespaces.load, clients.load, recorders.load, "cold"
                )
            # After the cold sections: the pool's sandboxes would share the node with them.
            if any(section in sections for section in POOL_SECTIONS):
                self.run_pool(clients.pool, recorders.pool)
            if any(section in sections for section in SESSION_SECTIONS):
                self.run_sessions(clients.session, recorders.session)
            self.record_ratios()
            self.record_main_operator(operator_start, operator.sample(), recorders)
            progress("removing the executions (the operator releases them)")
        if "cost" in sections:
            self.run_cost()

    def start_sandpod(self, stack: ExitStack) -> tuple[OperatorProcess, GatewayClients]:
        """The main operator and the gateway, stopped by `stack`, and a gateway client for
        each of the three tenants (latency, load, pool)."""
        options = self.options
        keys = {
            tenant: f"sk-{secrets.token_urlsafe(24)}"
            for tenant in ("gateway", "load", "pool", "session")
        }
        self.core.create_namespaced_secret(
            self.namespaces.gateway,
            tenants_secret(
                {
                    "bench-latency": (self.namespaces.gateway, keys["gateway"]),
                    "bench-load": (self.namespaces.load, keys["load"]),
                    "bench-pool": (self.namespaces.pool, keys["pool"]),
                    "bench-session": (self.namespaces.session, keys["session"]),
                }
            ),
        )
        # The direct path between the two, as the chart sets it up (a token both read).
        token_file = self.log_dir / "direct-token"
        token_file.write_text(secrets.token_urlsafe(36))
        progress("starting the operator and the gateway")
        operator = self.start_operator(
            stack,
            options.kubeconfig,
            self.namespaces.sandpod,
            "operator.log",
            direct_token_file=token_file,
        )
        gateway = GatewayProcess(
            kubeconfig=options.kubeconfig,
            keys_namespace=self.namespaces.gateway,
            keys_secret=KEYS_SECRET,
            log_path=self.log_dir / "gateway.log",
            access_log=False,
            settings={
                "SANDPOD_GATEWAY_DIRECT_URL": operator.direct_url,
                "SANDPOD_GATEWAY_DIRECT_TOKEN_FILE": str(token_file),
            },
        )
        stack.enter_context(running(gateway))
        clients = GatewayClients(
            **{
                tenant: stack.enter_context(gateway_client(gateway.url, key))
                for tenant, key in keys.items()
            }
        )
        return operator, clients

    def kubectl_workload(self, recorder: Recorder, prefix: str) -> SandpodKubectl:
        options = self.options
        namespace = self.namespaces.kubectl
        return SandpodKubectl(options.kubectl, options.kubeconfig, namespace, recorder, prefix)

    def run_latency(self, recorders: Recorders, gateway_workload: SandpodGateway) -> None:
        """Sequential and concurrent runs via kubectl and via the gateway, and the time
        breakdown of the sequential ones."""
        runs, concurrency = self.options.runs, self.options.concurrency
        progress("warming up")
        self.warm("sandpod via kubectl", self.kubectl_workload(recorders.kubectl, "warm"))
        self.warm("sandpod via the gateway", gateway_workload)
        sequential_kubectl = self.measure(
            "kubectl_sequential",
            "sandpod via kubectl apply, sequential",
            "sandpod-kubectl",
            self.kubectl_workload(recorders.kubectl, "seq"),
            runs=runs,
            concurrency=1,
        )
        self.measure(
            f"kubectl_concurrency_{concurrency}",
            f"sandpod via kubectl apply, concurrency {concurrency}",
            "sandpod-kubectl",
            self.kubectl_workload(recorders.kubectl, "conc"),
            runs=runs,
            concurrency=concurrency,
        )
        sequential_gateway = self.measure(
            "gateway_sequential",
            "sandpod via the gateway, sequential",
            "sandpod-gateway",
            gateway_workload,
            runs=runs,
            concurrency=1,
        )
        self.measure(
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
        self.results.setdefault("breakdown", {}).update(breakdown)

    def record_ratios(self) -> None:
        """sandpod's latency against the baselines' (when both were measured)."""
        if self.results.get("latency"):
            for statistic in ("p50", "p95"):
                self.results[f"ratios_{statistic}"] = baseline_ratios(
                    self.results["latency"],
                    self.results.get("baselines") or {},
                    statistic,
                )

    def run_throughput(
        self, namespace: str, http: httpx.Client, recorder: Recorder, what: str
    ) -> dict[str, Any]:
        """Closed-loop clients into `namespace` (cold: no pool there; or the pool's), audited;
        with how the executions started."""
        options = self.options
        prefix = f"load-{what}"
        workloads: dict[str, Workload] = {
            "gateway": SandpodGateway(http, recorder),
            "api": SandpodApi(self.custom, namespace, recorder, prefix),
            "kubectl": SandpodKubectl(
                options.kubectl, options.kubeconfig, namespace, recorder, prefix
            ),
        }
        workload = workloads[options.throughput_path]
        self.warm(f"the {what} throughput path", workload)
        earlier = {observation.name for observation in recorder.all()}
        progress(
            f"throughput ({what}): {options.throughput_concurrency} clients via "
            f"{options.throughput_path} for {options.duration:.0f}s"
        )
        throughput = measure_throughput(
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

    def fill_pool(self) -> None:
        if not wait_pool_full(self.custom, self.namespaces.pool, POOL_FILL_SECONDS):
            self.notes.append(f"the pool was not full after {POOL_FILL_SECONDS} s")

    def run_pool(self, http: httpx.Client, recorder: Recorder) -> None:
        """The pool sections: a SandboxPool in its own namespace, filled before each
        measurement; sequential print(1) through the gateway and kubectl and the warm
        breakdown ('pool'), and throughput ('pool-throughput')."""
        options, namespace = self.options, self.namespaces.pool
        progress(f"pool: a SandboxPool of {options.pool_size} in {namespace}, filling")
        create_pool(self.custom, namespace, options.pool_size)
        self.fill_pool()
        if "pool" in options.sections:
            self.run_pool_latency(http, recorder)
        if "pool-throughput" in options.sections:
            self.fill_pool()
            self.results["pool_throughput"] = self.run_throughput(namespace, http, recorder, "pool")

    def run_pool_latency(self, http: httpx.Client, recorder: Recorder) -> None:
        options, namespace = self.options, self.namespaces.pool
        gateway = SandpodGateway(http, recorder)
        self.warm("the gateway from a pool", gateway)
        self.warm(
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
            self.fill_pool()
            key = f"pool_{path}_sequential"
            attempts = self.measure(
                key, label, f"sandpod-pool-{path}", workload, runs=options.runs, concurrency=1
            )
            modes = start_modes(recorder, [a.name for a in attempts if a.name])
            warm = summarize([a.seconds for a in attempts if a.ok and ran_warm(recorder, a.name)])
            entry = self.results["latency"][key]
            entry["start_modes"] = modes
            entry["warm_only"] = warm.as_dict() if warm else None
            progress(f"  started {modes}; warm runs only: p50 {warm.p50 if warm else '-'}")
            measured[path] = attempts
        marks = operator_marks(self.log_dir / "operator.log")
        breakdown = {}
        for path, attempts in measured.items():
            entry = breakdown_entry(recorder, attempts, marks)
            if entry:
                breakdown[f"pool {path}"] = entry
        self.results["pool_breakdown"] = breakdown

    def run_sessions(self, http: httpx.Client, recorder: Recorder) -> None:
        """The session sections, in their own namespace (no pool: cold-started sessions):
        print(1) in one session through the gateway and through kubectl, back to back (no
        kubelet clock to dodge), with where the time goes, and llm-sandbox's own session
        ('session'); throughput across --session-clients sessions ('session-throughput')."""
        if "session" in self.options.sections:
            self.run_session_latency(http, recorder)
            self.run_llm_sandbox_session()
        if "session-throughput" in self.options.sections:
            self.results["session_throughput"] = self.run_session_throughput(http, recorder)

    def run_session_latency(self, http: httpx.Client, recorder: Recorder) -> None:
        options, namespace = self.options, self.namespaces.session
        progress(f"sessions in {namespace}: one through the gateway, one as a CodeSession")
        [via_gateway] = self.ready_sessions(lambda: open_through_gateway(http), 1)
        [via_kubectl] = self.ready_sessions(
            lambda: create_session(self.custom, namespace, f"bench-{uuid.uuid4().hex[:8]}"), 1
        )
        gateway = SandpodGateway(http, recorder, f"/v1/sessions/{via_gateway}/executions")
        self.warm("a session via the gateway", gateway)
        self.warm(
            "a session via kubectl",
            SandpodKubectl(
                options.kubectl, options.kubeconfig, namespace, recorder, "warm", via_kubectl
            ),
        )
        kubectl = SandpodKubectl(
            options.kubectl, options.kubeconfig, namespace, recorder, "sess", via_kubectl
        )
        breakdown = {}
        for path, workload in (("gateway", gateway), ("kubectl", kubectl)):
            attempts = self.measure(
                f"session_{path}_sequential",
                f"print(1) in a session via {path}, sequential",
                f"sandpod-session-{path}",
                workload,
                runs=options.session_runs,
                concurrency=1,
                group="session_latency",
                think_seconds=0,
            )
            entry = breakdown_entry(recorder, attempts, session=True)
            if entry:
                breakdown[f"session {path}"] = entry
        self.results["session_breakdown"] = breakdown

    def ready_sessions(self, open_one: Callable[[], str], count: int) -> list[str]:
        """`count` sessions opened at once and waited for until Ready; one that ends while
        starting (StartupTimeout on a busy node) is replaced, at most `count` times, with a
        note."""
        waiting = [open_one() for _ in range(count)]
        ready: list[str] = []
        replaced = 0
        while waiting:
            name = waiting.pop(0)
            try:
                wait_ready(self.custom, self.namespaces.session, name, SESSION_START_SECONDS)
            except SessionNotReady as error:
                if replaced >= count:
                    raise
                replaced += 1
                self.notes.append(f"a session did not start ({error}); opened another")
                waiting.append(open_one())
                continue
            ready.append(name)
        return ready

    def run_llm_sandbox_session(self) -> None:
        """llm-sandbox's own session on the baselines' pod spec: opened once, then print(1)
        in it back to back."""
        namespace = self.namespaces.baselines
        self.ensure_baseline_policy()
        workload = LlmSandboxSession(self.core, namespace, self.catalog, self.settings)
        progress("llm-sandbox: opening its session")
        workload.open()
        try:
            self.warm("llm-sandbox's session", workload)
            self.measure(
                "llm_sandbox_session",
                "llm-sandbox's own session (run in its open pod)",
                "baseline-llm-sandbox-session",
                workload,
                runs=self.options.session_runs,
                concurrency=1,
                group="session_latency",
                think_seconds=0,
            )
        finally:
            workload.close()

    def run_session_throughput(self, http: httpx.Client, recorder: Recorder) -> dict[str, Any]:
        """--session-clients closed-loop clients through the gateway, each in a session of
        its own, audited as the other throughputs, and each session's own executionCount
        checked against the executions seen naming it."""
        options = self.options
        progress(f"session throughput: opening {options.session_clients} sessions")
        names = self.ready_sessions(lambda: open_through_gateway(http), options.session_clients)
        workloads = [
            SandpodGateway(http, recorder, f"/v1/sessions/{name}/executions") for name in names
        ]
        for index, workload in enumerate(workloads):
            self.warm(f"session {index} of the throughput", workload)
        progress(
            f"throughput (sessions): {options.session_clients} clients, one session each, "
            f"via the gateway for {options.duration:.0f}s"
        )
        throughput = measure_throughput(
            PerClient(workloads),
            recorder,
            path="gateway, a session per client",
            concurrency=options.session_clients,
            duration_seconds=options.duration,
        )
        mismatches = self.session_count_mismatches(recorder, names)
        throughput["session_count_mismatches"] = {k: list(v) for k, v in mismatches.items()}
        progress(
            f"  {throughput['executions_per_second']:.2f}/s, lost {throughput['lost']}, "
            f"duplicated {throughput['duplicated']}, failed {throughput['failed']}, "
            f"sessions whose count disagrees {len(mismatches)}"
        )
        return throughput

    def session_count_mismatches(
        self, recorder: Recorder, names: Sequence[str]
    ) -> dict[str, tuple[int, int | None]]:
        """The sessions write their count after the execution's status: allow them 10 s."""
        deadline = time.monotonic() + 10
        while True:
            seen = executions_by_session(recorder.all())
            mismatches = count_mismatches(
                seen, execution_counts(self.custom, self.namespaces.session, names)
            )
            if not mismatches or time.monotonic() > deadline:
                return mismatches
            time.sleep(0.5)

    def record_main_operator(
        self, start: ProcessSample, end: ProcessSample, recorders: Recorders
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
            self.results["main_operator"] = {
                "executions": handled,
                "cpu_seconds": cpu,
                "cpu_seconds_per_100_executions": cpu / handled * 100,
                "rss_mib_end": end.rss_bytes / 1024 / 1024,
                "peak_rss_mib": end.peak_rss_bytes / 1024 / 1024,
            }

    def ensure_baseline_policy(self) -> None:
        """The baselines' deny-all NetworkPolicy (the same enforcer work as for sandboxes)."""
        namespace = self.namespaces.baselines
        policies: Any = client.NetworkingV1Api(self.api)
        try:
            policies.create_namespaced_network_policy(
                namespace, manifests.baseline_network_policy(namespace)
            )
        except client.ApiException as error:
            if error.status != 409:
                raise

    def run_baselines(self) -> None:
        options = self.options
        namespace = self.namespaces.baselines
        self.ensure_baseline_policy()
        catalog, settings, core = self.catalog, self.settings, self.core
        batch = client.BatchV1Api(self.api)
        candidates: dict[str, tuple[str, Callable[[str], Workload]]] = {
            "job": (
                "Kubernetes Job (create → Complete, log)",
                lambda prefix: JobBaseline(batch, core, namespace, catalog, settings, prefix),
            ),
            "pod": (
                "bare pod (create → container exited, log)",
                lambda prefix: BarePod(core, namespace, catalog, settings, prefix, self.containerd),
            ),
            "llm-sandbox": (
                "llm-sandbox, Kubernetes backend (open, run)",
                lambda prefix: LlmSandbox(core, namespace, catalog, settings),
            ),
        }
        for key in options.baselines:
            label, make = candidates[key]
            warm = run_many(make(f"{key}-warm"), runs=1, concurrency=1)[0]
            if not warm.ok:
                progress(f"{label}: the warm-up failed: {warm.error}")
            attempts = self.measure(
                key,
                label,
                f"baseline-{key}",
                make(f"{key}-run"),
                runs=options.baseline_runs,
                concurrency=1,
            )
            if key == "pod" and (entry := breakdown_entry(None, attempts)):
                self.results.setdefault("breakdown", {})["bare pod"] = entry

    def start_operator(
        self,
        stack: ExitStack,
        kubeconfig: Path,
        namespaces: list[str],
        log_name: str,
        direct_token_file: Path | None = None,
    ) -> OperatorProcess:
        """An operator watching `namespaces`, stopped by `stack` once their executions are
        gone (it releases their finalizers); pool pods' runners admit it (it runs here). With
        `direct_token_file`, its direct path is on."""
        operator = OperatorProcess(
            kubeconfig=kubeconfig,
            namespaces=namespaces,
            log_path=self.log_dir / log_name,
            runner_ingress_from=[{"ipBlock": {"cidr": f"{node_address(self.core)}/32"}}],
            direct_token_file=direct_token_file,
        )
        stack.callback(operator.stop)
        operator.start()
        stack.callback(delete_executions, self.custom, namespaces, operator)
        return operator

    def run_cost(self) -> None:
        options = self.options
        namespace = self.namespaces.cost
        progress(f"operator cost: {options.cost_executions} executions through a counting proxy")
        with ExitStack() as stack:
            proxy = ProxyProcess(kubeconfig=options.kubeconfig, log_path=self.log_dir / "proxy.log")
            stack.enter_context(running(proxy))
            proxied = self.log_dir / "proxy.kubeconfig"
            proxied.write_text(yaml.safe_dump(proxy_kubeconfig(proxy.port)))
            operator = self.start_operator(stack, proxied, [namespace], "operator-cost.log")
            recorder = self.recorder(namespace, stack)
            warm = run_many(
                SandpodApi(self.custom, namespace, recorder, "warm"), runs=2, concurrency=1
            )
            if not all(a.ok for a in warm):
                raise BenchError(f"warm-up of the cost section failed: {warm[0].error}")
            if not wait_quiet(proxy.counts, quiet_seconds=3, timeout=60):
                self.notes.append("the operator never went quiet before the cost measurement")
            before, counts_before, own_before = (
                operator.sample(),
                proxy.counts(),
                operator.own_requests(),
            )
            started = time.perf_counter()
            attempts = run_many(
                SandpodApi(self.custom, namespace, recorder, "cost"),
                runs=options.cost_executions,
                concurrency=options.cost_concurrency,
            )
            if not wait_quiet(proxy.counts, quiet_seconds=3, timeout=60):
                self.notes.append("the operator never went quiet after the cost measurement")
            seconds = time.perf_counter() - started
            after, counts_after, own_after = (
                operator.sample(),
                proxy.counts(),
                operator.own_requests(),
            )
            summary = cost_summary(
                executions=options.cost_executions,
                before=before,
                after=after,
                requests_before=counts_before,
                requests_after=counts_after,
                own_before=own_before,
                own_after=own_after,
                seconds=seconds,
            )
            summary["concurrency"] = options.cost_concurrency
            summary["failures"] = sum(1 for a in attempts if not a.ok)
            self.results["operator_cost"] = summary
            progress(
                f"  {summary['cpu_seconds_per_100_executions']:.1f} CPU s per 100, "
                f"{summary['api_requests_per_execution']:.1f} API requests per execution"
            )
            progress("removing the cost section's executions")


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
    namespaces = Namespaces(f"bench-{run_id}")
    log_dir = options.output_dir / "logs" / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    api = connect(options.kubeconfig, pool=max(32, options.throughput_concurrency * 2))
    if not api_server_answers(api, timeout=120):
        print(
            f"no cluster: the API server of {options.kubeconfig} does not answer", file=sys.stderr
        )
        return 2
    settings = OperatorSettings()
    results = run_facts(options, settings, api, log_dir, started)
    notes: list[str] = []
    note_other_activity(client.CoreV1Api(api), namespaces.prefix, results, notes)
    bench = Bench(
        options=options,
        api=api,
        namespaces=namespaces,
        catalog=load_catalog(settings.catalog_path),
        settings=settings,
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
    settings: OperatorSettings,
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
        "image": load_catalog(settings.catalog_path).languages[manifests.LANGUAGE].image,
        "runtime_class": settings.runtime_class_name,
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
        ensure_runtime_class(bench.api, bench.settings.runtime_class_name)
        for namespace in namespaces:
            # On a busy cluster the controller manager is slow to make the service account.
            create_namespace(core, namespace, labels=BENCH_LABELS, timeout=300)
        bench.run()
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
