#!/usr/bin/env python3
"""One-off runs from a pool, a pod per run against many runs per pod (each in a fresh box),
measured in the same run on the install `make run` leaves (its gateway on 127.0.0.1:8080,
its tenant's key in .cluster/api-key, the `python` pool of its namespace).

For each setting of the pool's `runsPerSandbox` (1: the baseline, a pod per run; then the
default, many runs per pod): print(1) through the gateway one after another (p50, p99), then
a sustained rate of one-off runs (runs/s asked, done, failed, cold starts, p50 and p99, node
CPU per run from /proc/stat), then, with boxes, a memory hog's time to its verdict. Prints a
table and writes benchmarks/results/warm-runs-<date>.json. Restores the pool afterwards.

    .venv/bin/python benchmarks/warm_runs.py [--rate 20] [--seconds 60] [--pool-size 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = "http://127.0.0.1:8080"
NAMESPACE = "sandpod-dev"
POOL = "python"
GROUP, VERSION = "sandpod.dev", "v1alpha1"
PRINT_1 = {"language": "python", "code": "print(1)"}
HOGS = {
    "append 10 MB chunks": "a = []\nwhile True:\n    a.append(bytearray(10**7))\n",
    "one 512 MiB bytearray": "b = bytearray(512 * 1024 * 1024)\n",
}
FILL_SECONDS = 300


@dataclass
class Phase:
    """What one setting of the pool gave."""

    runs_per_sandbox: int | None
    sequential_p50_ms: float = 0.0
    sequential_p99_ms: float = 0.0
    asked_per_second: float = 0.0
    done_per_second: float = 0.0
    runs: int = 0
    failed: int = 0
    cold: int = 0
    sustained_p50_ms: float = 0.0
    sustained_p99_ms: float = 0.0
    node_cpu_ms_per_run: float = 0.0
    memory_verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def node_cpu_seconds() -> float:
    """CPU time the whole machine (the node, everything on it) spent, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def set_pool(objects: client.CustomObjectsApi, size: int, runs: int | None) -> None:
    patch = {"spec": {"size": size, "runsPerSandbox": runs}}
    objects.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "sandboxpools", POOL, patch)
    deadline = time.monotonic() + FILL_SECONDS
    while time.monotonic() < deadline:
        pool: Any = objects.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "sandboxpools", POOL
        )
        status = pool.get("status") or {}
        seen = status.get("observedGeneration") == pool["metadata"]["generation"]
        if seen and status.get("ready") == size and status.get("total") == size:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the pool did not fill to {size}")


async def one(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = await http.post("/v1/executions", json=body)
    seconds = time.perf_counter() - started
    answer: dict[str, Any] = response.json() if response.status_code == 200 else {}
    return seconds, answer


async def sequential(http: httpx.AsyncClient, count: int) -> list[float]:
    return [(await one(http, PRINT_1))[0] for _ in range(count)]


async def sustained(
    http: httpx.AsyncClient, rate: float, seconds: float
) -> list[tuple[float, dict[str, Any]]]:
    """Open loop: a run started every 1/rate s for `seconds`, whatever the earlier ones do."""
    tasks = []
    start = time.monotonic()
    for index in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one(http, PRINT_1)))
    return list(await asyncio.gather(*tasks))


def start_modes(objects: client.CustomObjectsApi, ids: list[str]) -> dict[str, str]:
    """Each run's startMode, from its record (written behind the answer)."""
    deadline = time.monotonic() + 60
    modes: dict[str, str] = {}
    while time.monotonic() < deadline:
        listed: Any = objects.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "codeexecutions"
        )
        modes = {
            item["metadata"]["name"]: (item.get("status") or {}).get("startMode", "")
            for item in listed["items"]
        }
        if all(modes.get(name) for name in ids):
            break
        time.sleep(1)
    return modes


async def measure(
    objects: client.CustomObjectsApi, http: httpx.AsyncClient, phase: Phase, args: Any
) -> None:
    await sequential(http, 3)  # the gateway's connection and the pods' first runs
    latencies = await sequential(http, args.sequential)
    phase.sequential_p50_ms = 1000 * statistics.median(latencies)
    phase.sequential_p99_ms = 1000 * percentile(latencies, 0.99)
    cpu_before, wall_before = node_cpu_seconds(), time.monotonic()
    results = await sustained(http, args.rate, args.seconds)
    cpu = node_cpu_seconds() - cpu_before
    wall = time.monotonic() - wall_before
    done = [(seconds, answer) for seconds, answer in results if answer.get("status") == "success"]
    phase.asked_per_second = args.rate
    phase.runs, phase.failed = len(results), len(results) - len(done)
    phase.done_per_second = len(done) / wall
    phase.sustained_p50_ms = 1000 * percentile([s for s, _ in done], 0.5)
    phase.sustained_p99_ms = 1000 * percentile([s for s, _ in done], 0.99)
    phase.node_cpu_ms_per_run = 1000 * cpu / max(1, len(done))
    ids = [answer["id"] for _, answer in done]
    modes = start_modes(objects, ids)
    phase.cold = sum(1 for name in ids if modes.get(name) == "cold")
    if phase.runs_per_sandbox == 1:
        return
    for label, code in HOGS.items():
        seconds, answer = await one(http, {"language": "python", "code": code})
        phase.memory_verdicts[label] = {
            "seconds": round(seconds, 3),
            "status": answer.get("status"),
            "reason": answer.get("reason"),
        }


def hog_verdict(phase: Phase, label: str) -> str:
    verdict = phase.memory_verdicts.get(label)
    return "-" if verdict is None else f"{verdict['reason']} in {verdict['seconds']} s"


def table(phases: list[Phase]) -> str:
    rows = [
        ("runs per pod", *(str(p.runs_per_sandbox or "default (100)") for p in phases)),
        (
            "print(1) sequential p50 / p99 ms",
            *(f"{p.sequential_p50_ms:.0f} / {p.sequential_p99_ms:.0f}" for p in phases),
        ),
        (
            "asked runs/s, done runs/s",
            *(f"{p.asked_per_second:.0f}, {p.done_per_second:.1f}" for p in phases),
        ),
        ("runs, failed, cold starts", *(f"{p.runs}, {p.failed}, {p.cold}" for p in phases)),
        (
            "sustained p50 / p99 ms",
            *(f"{p.sustained_p50_ms:.0f} / {p.sustained_p99_ms:.0f}" for p in phases),
        ),
        ("node CPU ms per run", *(f"{p.node_cpu_ms_per_run:.0f}" for p in phases)),
    ]
    for label in HOGS:
        rows.append((f"memory hog ({label})", *(hog_verdict(p, label) for p in phases)))
    width = max(len(row[0]) for row in rows)
    return "\n".join(
        f"{row[0]:<{width}}  " + "  ".join(f"{cell:>26}" for cell in row[1:]) for row in rows
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="sustained runs/s asked")
    parser.add_argument("--seconds", type=float, default=60.0, help="sustained phase length")
    parser.add_argument("--sequential", type=int, default=40, help="sequential runs")
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args()
    config.load_kube_config(str(ROOT / ".cluster" / "kubeconfig"))
    objects = client.CustomObjectsApi()
    pool: Any = objects.get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, "sandboxpools", POOL
    )
    before = pool["spec"]
    key = (ROOT / ".cluster" / "api-key").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    phases = [Phase(runs_per_sandbox=1), Phase(runs_per_sandbox=None)]
    try:
        async with httpx.AsyncClient(
            base_url=GATEWAY, headers=headers, timeout=120, limits=limits
        ) as http:
            for phase in phases:
                # A new runsPerSandbox is a new template: the pool replaces its pods.
                set_pool(objects, args.pool_size, phase.runs_per_sandbox)
                print(f"measuring runsPerSandbox={phase.runs_per_sandbox}", flush=True)
                await measure(objects, http, phase, args)
    finally:
        set_pool(objects, int(before["size"]), before.get("runsPerSandbox"))
    print(table(phases))
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = ROOT / "benchmarks" / "results" / f"warm-runs-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": "benchmarks/warm_runs.py "
                + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
                "phases": [asdict(p) for p in phases],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
