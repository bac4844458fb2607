"""Section `e2b`, in its own namespace with a session pool: E2B's official SDKs against the
bench's gateway, as agent code calls it. `run_code("1")` (e2b-code-interpreter) and
`commands.run("true")` (e2b) in one open sandbox, beside print(1) in a sandpod session of the
same namespace through the gateway; then `Sandbox.create()` to its first `run_code`, each
create from a full pool."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubernetes import client
from sandpod_contract.names import GROUP, SESSION_PLURAL, VERSION

from sandpod_bench.bench import Bench, GatewayClients, latency_entry
from sandpod_bench.cluster import progress
from sandpod_bench.pool import create_pool, wait_pool_full
from sandpod_bench.recorder import Recorder
from sandpod_bench.session import open_through_gateway, wait_ready
from sandpod_bench.workloads import (
    Attempt,
    E2bCommand,
    E2bCreate,
    E2bRunCode,
    SandpodGateway,
    Workload,
    e2b_options,
)

# Session sandboxes kept started for the creates (each create waits for the pool to be full).
POOL_SIZE = 2
POOL_FILL_SECONDS = 300
SESSION_START_SECONDS = 300
CREATES = 20
GROUP_KEY = "e2b_latency"


def run(bench: Bench, clients: GatewayClients, recorder: Recorder) -> None:
    from e2b_code_interpreter import Sandbox

    namespace, runs = bench.namespaces.e2b, bench.options.session_runs
    sdk = e2b_options(clients.url, clients.e2b_key)
    progress(f"E2B's SDKs in {namespace}: a session pool of {POOL_SIZE}")
    create_pool(bench.custom, namespace, POOL_SIZE, sessions=True)
    if not wait_pool_full(bench.custom, namespace, POOL_FILL_SECONDS):
        bench.notes.append(f"e2b: the session pool was not full after {POOL_FILL_SECONDS} s")
    sandbox = Sandbox.create(**sdk)
    session = open_through_gateway(clients.e2b)
    try:
        wait_ready(bench.custom, namespace, session, SESSION_START_SECONDS)
        workloads: dict[str, tuple[str, Workload]] = {
            "e2b_run_code": ("run_code('1'), E2B's code interpreter SDK", E2bRunCode(sandbox)),
            "e2b_commands_run": ("commands.run('true'), E2B's SDK", E2bCommand(sandbox)),
            "e2b_sandpod_session": (
                "print(1) in a sandpod session via the gateway",
                SandpodGateway(clients.e2b, recorder, f"/v1/sessions/{session}/executions"),
            ),
        }
        for key, (label, workload) in workloads.items():
            bench.warm(label, workload)
            bench.measure(
                key,
                label,
                f"sandpod-{key}",
                workload,
                runs=runs,
                concurrency=1,
                group=GROUP_KEY,
                think_seconds=0,
            )
    finally:
        sandbox.kill()
        clients.e2b.delete(f"/v1/sessions/{session}")
    measure_creates(bench, sdk)


def measure_creates(bench: Bench, sdk: dict[str, Any]) -> None:
    """Sandbox.create() and its first run_code, from a full pool each time; how each
    sandbox's session started (warm: from the pool), read from its CodeSession."""
    modes: Counter[str] = Counter()

    def note_start_mode(sandbox_id: str) -> None:
        modes[start_mode(bench.custom, bench.namespaces.e2b, sandbox_id)] += 1

    attempts = bench.measure(
        "e2b_create_first_run",
        "Sandbox.create() + first run_code('1'), from a session pool",
        "sandpod-e2b_create_first_run",
        E2bCreate(sdk, lambda: wait_for_pool(bench), note_start_mode),
        runs=CREATES,
        concurrency=1,
        group=GROUP_KEY,
    )
    entries = bench.results[GROUP_KEY]
    entries["e2b_create"] = latency_entry(
        "Sandbox.create(), from a session pool", "sandpod-e2b_create", 1, created_only(attempts)
    )
    for key in ("e2b_create_first_run", "e2b_create"):
        entries[key]["start_modes"] = dict(modes)


def wait_for_pool(bench: Bench) -> None:
    if not wait_pool_full(bench.custom, bench.namespaces.e2b, POOL_FILL_SECONDS):
        bench.notes.append(f"e2b: the session pool was not full again in {POOL_FILL_SECONDS} s")


def created_only(attempts: list[Attempt]) -> list[Attempt]:
    """The same attempts timed to when Sandbox.create() returned."""
    return [
        Attempt(a.ok, a.milestones["created"], a.name, a.error)
        for a in attempts
        if "created" in a.milestones
    ]


def start_mode(custom: client.CustomObjectsApi, namespace: str, name: str) -> str:
    """warm or cold, as the sandbox's CodeSession says."""
    session: Any = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, SESSION_PLURAL, name
    )
    return str((session.get("status") or {}).get("startMode") or "unknown")
