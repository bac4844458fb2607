"""Section `soak` (run only when named): three tenants of the bench's gateway, each a
namespace and an API key of its own, for --soak-minutes.

The two quiet tenants each run one client per kind, one run after another with a random
pause of 0..--think-time: cold runs (bash, which has no pool), pool runs (python, from a
small pool of the tenant's own), runs in a session through the gateway and through MCP, and
Judge0 submissions. After --soak-quiet-minutes the third tenant, with a real rate limit,
starts abusing the service: floods of creates beyond its rate, huge outputs (stdout and
output files), waits held open, output streams held open on one execution (more than its
limit per execution). Forged egress grants are not tried: the bench's operator runs without
the chart's egress proxy (the hostile suite tries them).

Reported: the quiet tenants' p50/p99 per kind in the quiet phase and in the abusive one,
every tenant's creates audited (each accepted request ends once: none lost or duplicated),
what the abusive tenant's requests got, and the API server's database size and stored
objects and the operator's RSS, sampled through the run.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from sandpod_bench.apiserver import read_metrics
from sandpod_bench.bench import Bench, GatewayClients, start_modes
from sandpod_bench.cluster import progress
from sandpod_bench.manifests import LANGUAGE, PROGRAM
from sandpod_bench.pool import create_pool, wait_pool_full
from sandpod_bench.processes import OperatorProcess
from sandpod_bench.recorder import Recorder
from sandpod_bench.session import open_through_gateway, wait_ready
from sandpod_bench.soak import (
    ABUSIVE_LIMITS,
    ABUSIVE_TENANT,
    ResourcePoint,
    Timed,
    compare_phases,
    count_outcomes,
    drift,
    outcome,
    parse_storage,
    phase_of,
)
from sandpod_bench.throughput import Finished, audit, settle
from sandpod_bench.workloads import (
    Attempt,
    Judge0Submission,
    McpSession,
    SandpodGateway,
    Workload,
    _guarded,
    json_body,
)

# Cold runs in a language the tenants have no pool of.
COLD_LANGUAGE, COLD_PROGRAM, COLD_STDOUT = "bash", "echo 1", "1\n"
POOL_SIZE = 3
SESSION_START_SECONDS = 300
WARM_UP_SETTLE_SECONDS = 30
POOL_FILL_SECONDS = 300
SAMPLE_SECONDS = 30
# Every accepted run ends within its timeout (60 s at most) plus a cold start.
SETTLE_SECONDS = 240
# Answers that refuse a run: a limit (4xx), or the API server away (503; the shared
# cluster's API server is restarted by others). A refused run that was made all the same
# still counts as lost (orphaned).
REFUSALS = ("HTTP 4", "HTTP 503")
# The objects whose counts are followed (apiserver_storage_objects' resource label).
FOLLOWED_OBJECTS = ("codeexecutions.sandpod.dev", "configmaps", "pods", "events")

# The abusive tenant's behaviours.
FLOOD_PER_SECOND = 40  # 8x the tenant's rate, whether or not the earlier ones were answered
FLOOD_IN_FLIGHT = 32
HELD_WAITS = 4
HELD_SECONDS = 50  # the held programs' run time, within the tenant's maxTimeoutSeconds
STREAMS_PER_EXECUTION = ABUSIVE_LIMITS["maxWaitsPerExecution"] + 1
REFUSED_PAUSE_SECONDS = 1.0  # a held wait or a huge output refused tries again after this
HUGE_OUTPUT_PROGRAM = """
import os, sys
outputs = os.environ.get("SANDPOD_OUTPUTS", "/tmp/outputs")
os.makedirs(outputs, exist_ok=True)
for index in range(2):
    with open(f"{outputs}/blob-{index}.bin", "wb") as blob:
        blob.write(os.urandom(400 * 1024))
line = "x" * 65535 + "\\n"
for _ in range(320):
    sys.stdout.write(line)
"""
HELD_PROGRAM = f"import time; time.sleep({HELD_SECONDS})"
SLOW_PRINTER = f"""
import time
for second in range({HELD_SECONDS}):
    print(second, flush=True)
    time.sleep(1)
"""


@dataclass
class Clock:
    """The soak's time: seconds since it began; the abusive phase from `abusive_from`."""

    abusive_from: float
    ends: float
    began: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return time.monotonic() - self.began

    def running(self) -> bool:
        return self.now() < self.ends


@dataclass
class Log:
    """What the soak's clients saw (thread-safe): the quiet tenants' timed attempts, every
    tenant's creates for the audit, the abusive tenant's answers."""

    timed: list[Timed] = field(default_factory=list)
    # (tenant, kind, phase) -> the executions of those attempts.
    names: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    creates: dict[str, list[Finished]] = field(default_factory=dict)
    answers: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def created(self, tenant: str, attempt: Attempt, at: float) -> None:
        with self.lock:
            self.creates.setdefault(tenant, []).append(Finished(attempt, at))

    def answered(self, behaviour: str, answer: str) -> None:
        with self.lock:
            self.answers.append((behaviour, answer))


def run(bench: Bench, clients: GatewayClients, operator: OperatorProcess) -> None:
    options = bench.options
    tenants = bench.namespaces.soak_tenants
    quiet = [tenant for tenant in tenants if tenant != ABUSIVE_TENANT]
    with ExitStack() as stack:
        recorders = {
            tenant: bench.recorder(namespace, stack) for tenant, namespace in tenants.items()
        }
        # Before the recorders' own stops: their watches wind down at once.
        for recorder in recorders.values():
            stack.callback(recorder.request_stop)
        workloads: dict[str, dict[str, Workload]] = {}
        for tenant in quiet:
            workloads[tenant] = prepare_tenant(bench, clients, tenant, recorders[tenant], stack)
        earlier = {
            tenant: {observation.name for observation in recorder.all()}
            for tenant, recorder in recorders.items()
        }
        clock = Clock(abusive_from=options.soak_quiet_minutes * 60, ends=options.soak_minutes * 60)
        log = Log()
        points: list[ResourcePoint] = []
        progress(
            f"soak: {options.soak_minutes:g} min, the abusive tenant from minute "
            f"{options.soak_quiet_minutes:g}"
        )
        sampler_stop = threading.Event()
        sampler = threading.Thread(
            target=sample_resources,
            args=(bench, operator, clock, points, sampler_stop),
            daemon=True,
        )
        sampler.start()
        threads = [
            threading.Thread(
                target=quiet_client,
                args=(tenant, kind, workload, clock, options.think_time, log),
                daemon=True,
            )
            for tenant, kinds in workloads.items()
            for kind, workload in kinds.items()
        ]
        threads.append(
            threading.Thread(
                target=abuse, args=(clients.soak[ABUSIVE_TENANT], clock, log), daemon=True
            )
        )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        progress("soak: the clients are done; waiting for every accepted run to end")
        for tenant, recorder in recorders.items():
            names = [f.attempt.name for f in log.creates.get(tenant, []) if f.attempt.name]
            settle(recorder, SETTLE_SECONDS, names)
        sampler_stop.set()
        sampler.join()
        points.append(resource_point(bench, operator, clock))
        audits = {
            tenant: asdict(
                audit(
                    log.creates.get(tenant, []),
                    [o for o in recorder.all() if o.name not in earlier[tenant]],
                    clock.ends,
                    REFUSALS,
                )
            )
            for tenant, recorder in recorders.items()
        }
    bench.results["soak"] = {
        "minutes": options.soak_minutes,
        "quiet_minutes": options.soak_quiet_minutes,
        "tenants": tenants,
        "abusive_tenant": ABUSIVE_TENANT,
        "abusive_limits": ABUSIVE_LIMITS,
        "kinds": compare_phases(log.timed),
        # How the one-off runs started (warm: a pool pod; cold), per phase.
        "start_modes": {
            f"{tenant}, {kind}, {phase}": start_modes(recorders[tenant], names)
            for (tenant, kind, phase), names in log.names.items()
            if kind in ("cold", "pool")
        },
        "audit": audits,
        "abusive_answers": count_outcomes(log.answers),
        "resources": {
            series: drift(points, series)
            for series in (
                "operator_rss_bytes",
                "storage_bytes",
                *(f"objects:{resource}" for resource in FOLLOWED_OBJECTS),
            )
        },
        "points": [asdict(point) for point in points],
    }
    for tenant, found in audits.items():
        progress(
            f"  {tenant}: {found['requests']} requests, lost {found['lost']}, "
            f"duplicated {found['duplicated']}, failed {found['failed']}"
        )


def prepare_tenant(
    bench: Bench, clients: GatewayClients, tenant: str, recorder: Recorder, stack: ExitStack
) -> dict[str, Workload]:
    """A quiet tenant's pool (filled) and two sessions (Ready), and its workloads, each
    warmed up once."""
    http, namespace = clients.soak[tenant], bench.namespaces.soak_tenants[tenant]
    progress(f"soak: {tenant}: a pool of {POOL_SIZE} and two sessions in {namespace}")
    create_pool(bench.custom, namespace, POOL_SIZE)
    via_gateway, via_mcp = open_through_gateway(http), open_through_gateway(http)
    for session in (via_gateway, via_mcp):
        wait_ready(bench.custom, namespace, session, SESSION_START_SECONDS)
    if not wait_pool_full(bench.custom, namespace, POOL_FILL_SECONDS):
        bench.notes.append(f"soak: {tenant}'s pool was not full after {POOL_FILL_SECONDS} s")
    mcp = McpSession(clients.url, clients.soak_keys[tenant], via_mcp)
    mcp.open()
    stack.callback(mcp.close)
    workloads: dict[str, Workload] = {
        "cold": SandpodGateway(
            http,
            recorder,
            language=COLD_LANGUAGE,
            program=COLD_PROGRAM,
            expected_stdout=COLD_STDOUT,
        ),
        "pool": SandpodGateway(http, recorder),
        "session, gateway": SandpodGateway(
            http, recorder, f"/v1/sessions/{via_gateway}/executions"
        ),
        "session, MCP": mcp,
        "judge0": Judge0Submission(http),
    }
    warm_ups = [
        bench.warm(f"{tenant}'s {kind} runs", workload) for kind, workload in workloads.items()
    ]
    # The direct runs' records come behind their answers: in before the audit's snapshot.
    settle(recorder, WARM_UP_SETTLE_SECONDS, [attempt.name for attempt in warm_ups if attempt.name])
    return workloads


def quiet_client(
    tenant: str, kind: str, workload: Workload, clock: Clock, think: float, log: Log
) -> None:
    """Runs of one kind, one after another with a random pause, until the soak ends."""
    index = 0
    while True:
        time.sleep(random.uniform(0, think))
        at = clock.now()
        if at >= clock.ends:
            return
        attempt = _guarded(workload, index)
        index += 1
        phase = phase_of(at, clock.abusive_from)
        with log.lock:
            log.timed.append(Timed(tenant, kind, phase, attempt.ok, attempt.seconds, attempt.error))
            log.names.setdefault((tenant, kind, phase), []).append(attempt.name)
        log.created(tenant, attempt, clock.now())


# --- the abusive tenant --------------------------------------------------------------------


def abuse(http: httpx.Client, clock: Clock, log: Log) -> None:
    """From the abusive phase on, every behaviour at once until the soak ends."""
    while clock.running() and clock.now() < clock.abusive_from:
        time.sleep(0.5)
    behaviours: list[Callable[[], None]] = [
        lambda: flood(http, clock, log),
        *(lambda: hold_wait(http, clock, log) for _ in range(HELD_WAITS)),
        lambda: huge_outputs(http, clock, log),
        lambda: hold_streams(http, clock, log),
    ]
    threads = [threading.Thread(target=behaviour, daemon=True) for behaviour in behaviours]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def create(
    http: httpx.Client,
    behaviour: str,
    clock: Clock,
    log: Log,
    code: str,
    *,
    wait: bool,
    **fields: Any,
) -> tuple[bool, str]:
    """One create of the abusive tenant, counted and, when accepted, audited: (accepted,
    the execution's id)."""
    started = time.perf_counter()
    try:
        response = http.post(
            "/v1/executions",
            params={"wait": "true" if wait else "false"},
            json={"language": LANGUAGE, "code": code, **fields},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
    except httpx.HTTPError as error:
        log.answered(behaviour, type(error).__name__)
        log.created(
            ABUSIVE_TENANT,
            Attempt(False, time.perf_counter() - started, error=type(error).__name__),
            clock.now(),
        )
        return False, ""
    body = json_body(response)
    log.answered(behaviour, outcome(response.status_code, body))
    name = str(body.get("id") or "")
    accepted = response.status_code in (200, 202)
    problem = None if accepted else f"HTTP {response.status_code}: {response.text[:200]}"
    log.created(
        ABUSIVE_TENANT,
        Attempt(accepted, time.perf_counter() - started, name, problem),
        clock.now(),
    )
    return accepted, name


def flood(http: httpx.Client, clock: Clock, log: Log) -> None:
    """Creates without waiting, FLOOD_PER_SECOND a second, each sent without waiting for
    the earlier ones' answers (a busy gateway answers slowly: a closed loop would slow down
    with it); at most FLOOD_IN_FLIGHT at once."""
    in_flight = threading.BoundedSemaphore(FLOOD_IN_FLIGHT)

    def one() -> None:
        try:
            create(http, "flood: creates without waiting", clock, log, PROGRAM, wait=False)
        finally:
            in_flight.release()

    with ThreadPoolExecutor(max_workers=FLOOD_IN_FLIGHT) as pool:
        while clock.running():
            in_flight.acquire()
            pool.submit(one)
            time.sleep(1 / FLOOD_PER_SECOND)


def hold_wait(http: httpx.Client, clock: Clock, log: Log) -> None:
    """A waiting create of a program that sleeps HELD_SECONDS, again and again."""
    while clock.running():
        accepted, _ = create(
            http, "waits held open", clock, log, HELD_PROGRAM, wait=True, timeout_seconds=60
        )
        if not accepted:
            time.sleep(REFUSED_PAUSE_SECONDS)


def huge_outputs(http: httpx.Client, clock: Clock, log: Log) -> None:
    """A waiting create of a program printing 20 MiB (8 MiB kept) and leaving 800 KiB of
    output files, again and again."""
    while clock.running():
        accepted, _ = create(
            http,
            "huge outputs",
            clock,
            log,
            HUGE_OUTPUT_PROGRAM,
            wait=True,
            max_output_bytes=8 * 1024 * 1024,
        )
        if not accepted:
            time.sleep(REFUSED_PAUSE_SECONDS)


def hold_streams(http: httpx.Client, clock: Clock, log: Log) -> None:
    """A program printing a line a second for HELD_SECONDS, and STREAMS_PER_EXECUTION
    output streams held open on it at once (one more than the tenant's limit)."""
    while clock.running():
        accepted, name = create(http, "streamed runs", clock, log, SLOW_PRINTER, wait=False)
        if not accepted or not name:
            time.sleep(REFUSED_PAUSE_SECONDS)
            continue
        streams = [
            threading.Thread(target=follow, args=(http, name, log), daemon=True)
            for _ in range(STREAMS_PER_EXECUTION)
        ]
        for stream in streams:
            stream.start()
        for stream in streams:
            stream.join()


def follow(http: httpx.Client, name: str, log: Log) -> None:
    """One output stream, read to its end."""
    behaviour = "streams held open"
    try:
        with http.stream("GET", f"/v1/executions/{name}/stream") as response:
            if response.status_code != 200:
                response.read()
                log.answered(behaviour, outcome(response.status_code, json_body(response)))
                return
            for _ in response.iter_lines():
                pass
            log.answered(behaviour, "200, read to the end")
    except httpx.HTTPError as error:
        log.answered(behaviour, type(error).__name__)


# --- the cluster's and the operator's size -------------------------------------------------


def resource_point(bench: Bench, operator: OperatorProcess, clock: Clock) -> ResourcePoint:
    """The operator's RSS and the API server's storage now (None for what could not be
    read: the API server may be away, other sessions restart it)."""
    rss = operator.sample().rss_bytes if operator.alive() else None
    try:
        storage = parse_storage(read_metrics(bench.api))
    except Exception as error:
        progress(f"soak: the API server's metrics could not be read ({type(error).__name__})")
        return ResourcePoint(clock.now(), rss, None, None, {})
    objects = {name: storage.objects[name] for name in FOLLOWED_OBJECTS if name in storage.objects}
    return ResourcePoint(clock.now(), rss, storage.size_bytes, storage.metric, objects)


def sample_resources(
    bench: Bench,
    operator: OperatorProcess,
    clock: Clock,
    points: list[ResourcePoint],
    stop: threading.Event,
) -> None:
    while True:
        point = resource_point(bench, operator, clock)
        points.append(point)
        progress(
            f"soak: minute {point.at / 60:.1f}: operator RSS {mebibytes(point.operator_rss_bytes)}"
            f", database {mebibytes(point.storage_bytes)}, objects {point.objects}"
        )
        if stop.wait(SAMPLE_SECONDS):
            return


def mebibytes(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024 / 1024:.1f} MiB"
