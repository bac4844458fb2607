"""The bench itself: its options, cluster connection, namespaces and recorders, the operator
and gateway it starts, and how a section measures (warm-up, runs, the latency entry and the
breakdown of where the time went). The sections (sandpod_bench.sections) use it."""

from __future__ import annotations

import hashlib
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from sandpod_contract.catalog import Catalog

from sandpod_bench.breakdown import (
    KINDS,
    kubernetes_timestamps,
    largest,
    slices,
    summarize_slices,
)
from sandpod_bench.cluster import BenchError, Namespaces, delete_executions, progress, running
from sandpod_bench.containerd import ContainerdEvents
from sandpod_bench.kube import Manifest
from sandpod_bench.options import Options
from sandpod_bench.pool import node_address
from sandpod_bench.processes import GatewayProcess, OperatorProcess
from sandpod_bench.recorder import Recorder
from sandpod_bench.soak import ABUSIVE_LIMITS, ABUSIVE_TENANT, SOAK_RECORD_TTL_SECONDS
from sandpod_bench.stats import median, summarize
from sandpod_bench.timings import Marks
from sandpod_bench.workloads import RUN_TIMEOUT_SECONDS, Attempt, SandpodApi, Workload, run_many

KEYS_SECRET = "bench-api-keys"
# The bench tenants' request rate and burst: far above what the benchmarks send.
BENCH_REQUESTS_PER_SECOND = 10000
# The session tenant opens the throughput's sessions and those of the latency runs at once.
MAX_SESSIONS = 32


# The Judge0 tenants' maxConcurrent (section judge0): a class on a 2-core node.
JUDGE0_MAX_CONCURRENT = 8


BENCH_LIMITS = {
    "maxTimeoutSeconds": 60,
    "maxConcurrent": 256,
    "maxSessions": MAX_SESSIONS,
    "requestsPerSecond": BENCH_REQUESTS_PER_SECOND,
    "requestBurst": BENCH_REQUESTS_PER_SECOND,
}
JUDGE0_LIMITS = {**BENCH_LIMITS, "maxConcurrent": JUDGE0_MAX_CONCURRENT}


def tenants_secret(
    tenants: dict[str, tuple[str, str]], limits: Mapping[str, Mapping[str, int]] | None = None
) -> client.V1Secret:
    """The gateway's keys Secret: tenant -> (namespace, API key); each tenant with the
    bench's limits, or its own in `limits`."""
    document = {
        "tenants": {
            name: {
                "namespace": namespace,
                "limits": dict((limits or {}).get(name, BENCH_LIMITS)),
                "apiKeys": [{"name": "bench", "sha256": hashlib.sha256(key.encode()).hexdigest()}],
            }
            for name, (namespace, key) in tenants.items()
        }
    }
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEYS_SECRET),
        string_data={"tenants.yaml": yaml.safe_dump(document)},
    )


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
    kind: str = "cold",
    marks: Marks | None = None,
) -> dict[str, Any] | None:
    """Median slices over the successful attempts, with the milestones of `kind`
    (breakdown.KINDS): from the attempt itself and, for sandpod, from the recorder (watch
    events, containerd). With `marks` (the operator's timing lines), only over the attempts
    it has marks of (a warm run that went cold has none)."""
    names, slice_names = KINDS[kind]
    runs = []
    details = []
    for attempt in attempts:
        if not attempt.ok or not attempt.name:
            continue
        recorded = recorder.timeline(attempt.name) if recorder else {}
        if marks is not None:
            found = marks.get((recorder.namespace if recorder else "", attempt.name))
            if not found:
                continue  # it went cold (or the operator logged no timings)
            recorded = {**recorded, **found}
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
    e2b: Recorder

    def each(self) -> tuple[Recorder, ...]:
        return (self.kubectl, self.gateway, self.load, self.pool, self.session, self.e2b)

    def request_stop(self) -> None:
        for recorder in self.each():
            recorder.request_stop()


@dataclass(frozen=True)
class GatewayClients:
    """One gateway client per tenant: latency, load, pool, session, e2b, judge0; what an
    MCP client of the session tenant and E2B's SDK need (the gateway's URL, the tenants'
    keys); the soak's tenants' clients and keys (with the soak section)."""

    gateway: httpx.Client
    load: httpx.Client
    pool: httpx.Client
    session: httpx.Client
    e2b: httpx.Client
    judge0_cold: httpx.Client
    judge0_pool: httpx.Client
    url: str
    session_key: str
    e2b_key: str
    soak: dict[str, httpx.Client] = field(default_factory=dict)
    soak_keys: dict[str, str] = field(default_factory=dict)


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
    log_dir: Path
    containerd: ContainerdEvents | None
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _sandbox_pod: Manifest | None = None

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

    def sandbox_pod(self, recorder: Recorder) -> Manifest:
        """A sandbox pod as sandpod's operator made it for one print(1) run (in the namespace
        `recorder` watches), the model of the baselines' pods; made once."""
        if self._sandbox_pod is None:
            workload = SandpodApi(self.custom, recorder.namespace, recorder, "model")
            attempt = run_many(workload, runs=1, concurrency=1)[0]
            observation = recorder.get(attempt.name) if attempt.ok else None
            if observation is None or observation.pod is None:
                raise BenchError(f"no sandbox pod to model the baselines on: {attempt.error}")
            self._sandbox_pod = observation.pod
        return self._sandbox_pod

    def warm(self, what: str, workload: Workload) -> Attempt:
        attempt = run_many(workload, runs=1, concurrency=1)[0]
        if not attempt.ok:
            raise BenchError(f"warm-up of {what} failed: {attempt.error}")
        return attempt

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
            f"  p50 {summary['p50']:.3f}s p95 {summary['p95']:.3f}s p99 {summary['p99']:.3f}s, "
            f"{entry['failures']} failed"
            if summary
            else f"  every run failed: {entry['error']}"
        )
        group = group or ("latency" if path.startswith("sandpod") else "baselines")
        self.results.setdefault(group, {})[key] = entry
        return attempts

    def start_sandpod(self, stack: ExitStack) -> tuple[OperatorProcess, GatewayClients]:
        """The main operator and the gateway, stopped by `stack`, and a gateway client for
        each of the tenants (latency, load, pool, session)."""
        options = self.options
        keys = {
            tenant: f"sk-{secrets.token_urlsafe(24)}"
            for tenant in (
                "gateway",
                "load",
                "pool",
                "session",
                "e2b",
                "judge0_cold",
                "judge0_pool",
            )
        }
        soak_keys = {
            tenant: f"sk-{secrets.token_urlsafe(24)}" for tenant in self.namespaces.soak_tenants
        }
        self.core.create_namespaced_secret(
            self.namespaces.gateway,
            tenants_secret(
                {
                    "bench-latency": (self.namespaces.gateway, keys["gateway"]),
                    "bench-load": (self.namespaces.load, keys["load"]),
                    "bench-pool": (self.namespaces.pool, keys["pool"]),
                    "bench-session": (self.namespaces.session, keys["session"]),
                    "bench-e2b": (self.namespaces.e2b, keys["e2b"]),
                    **{
                        f"bench-{tenant}": (namespace, soak_keys[tenant])
                        for tenant, namespace in self.namespaces.soak_tenants.items()
                    },
                    "bench-judge0-cold": (self.namespaces.judge0_cold, keys["judge0_cold"]),
                    "bench-judge0-pool": (self.namespaces.judge0_pool, keys["judge0_pool"]),
                },
                {
                    f"bench-{ABUSIVE_TENANT}": ABUSIVE_LIMITS,
                    "bench-judge0-cold": JUDGE0_LIMITS,
                    "bench-judge0-pool": JUDGE0_LIMITS,
                },
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
            settings=gateway_settings(options, operator.direct_url, token_file),
        )
        stack.enter_context(running(gateway))
        clients = GatewayClients(
            **{
                tenant: stack.enter_context(gateway_client(gateway.url, key))
                for tenant, key in keys.items()
            },
            url=gateway.url,
            session_key=keys["session"],
            e2b_key=keys["e2b"],
            soak={
                tenant: stack.enter_context(gateway_client(gateway.url, key))
                for tenant, key in soak_keys.items()
            },
            soak_keys=soak_keys,
        )
        return operator, clients

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
            runtime_class=self.options.runtime_class,
            direct_token_file=direct_token_file,
        )
        stack.callback(operator.stop)
        operator.start()
        stack.callback(delete_executions, self.custom, namespaces, operator)
        return operator


def gateway_settings(options: Options, direct_url: str, token_file: Path) -> dict[str, str]:
    """The bench's gateway: on the operator's direct path; with the soak named, finished
    executions kept SOAK_RECORD_TTL_SECONDS."""
    settings = {
        "SANDPOD_GATEWAY_DIRECT_URL": direct_url,
        "SANDPOD_GATEWAY_DIRECT_TOKEN_FILE": str(token_file),
    }
    if "soak" in options.sections:
        settings["SANDPOD_GATEWAY_TTL_SECONDS_AFTER_FINISHED"] = str(SOAK_RECORD_TTL_SECONDS)
    return settings
