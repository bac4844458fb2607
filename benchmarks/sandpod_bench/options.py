"""The bench's command line: which sections run, how many runs, where it writes."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandpod_testkit.paths import REPO_ROOT, default_kubeconfig, kube_bin_dir

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
SECTIONS = (
    "latency",
    "baselines",
    "throughput",
    "pool",
    "pool-throughput",
    "session",
    "session-throughput",
    "e2b",
    "judge0",
    "cost",
)
# Run only when named: not part of a default run (or of make bench).
EXTRA_SECTIONS = ("soak",)
POOL_SECTIONS = ("pool", "pool-throughput")
SESSION_SECTIONS = ("session", "session-throughput")
BASELINES = ("job", "pod", "llm-sandbox")
# The RuntimeClass the bench's operator gives sandboxes (the chart's default).
RUNTIME_CLASS = "gvisor"


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
    soak_minutes: float
    soak_quiet_minutes: float
    sections: tuple[str, ...]
    baselines: tuple[str, ...]
    quick: bool
    clean_up: bool
    kubeconfig: Path
    kubectl: str
    output_dir: Path
    runtime_class: str


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
        help="clients of the session throughput, each with its own session (default 16)",
    )
    parser.add_argument(
        "--soak-minutes",
        type=float,
        help="the soak section's length, minutes (default 30; --quick 4)",
    )
    parser.add_argument(
        "--soak-quiet-minutes",
        type=float,
        help="of which the first, without the abusive tenant (default a quarter)",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} (the breakdowns come with latency, "
        f"pool and session), or {','.join(EXTRA_SECTIONS)}, which only runs when named",
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
        "--runtime-class",
        default=RUNTIME_CLASS,
        help=f"the RuntimeClass of sandboxes and baselines (default {RUNTIME_CLASS})",
    )
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
    unknown = [s for s in sections if s not in SECTIONS + EXTRA_SECTIONS] + [
        b for b in baselines if b not in BASELINES
    ]
    if unknown:
        parser.error(f"unknown section or baseline: {', '.join(unknown)}")
    soak_minutes = pick(arguments.soak_minutes, 30.0, 4.0)
    soak_quiet_minutes = (
        soak_minutes / 4 if arguments.soak_quiet_minutes is None else arguments.soak_quiet_minutes
    )
    if not 0 < soak_quiet_minutes < soak_minutes:
        parser.error("--soak-quiet-minutes must be more than 0 and less than --soak-minutes")
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
        session_clients=pick(arguments.session_clients, 16, 4),
        soak_minutes=soak_minutes,
        soak_quiet_minutes=soak_quiet_minutes,
        sections=sections,
        baselines=baselines,
        quick=quick,
        clean_up=bool(arguments.clean_up),
        kubeconfig=arguments.kubeconfig,
        kubectl=arguments.kubectl,
        output_dir=arguments.output_dir,
        runtime_class=arguments.runtime_class,
    )


def default_kubectl() -> str:
    """The local cluster's kubectl (built with it), else the one on PATH."""
    bin_dir = kube_bin_dir()
    if bin_dir is not None and (bin_dir / "kubectl").exists():
        return str(bin_dir / "kubectl")
    return shutil.which("kubectl") or "kubectl"
