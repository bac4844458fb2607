"""The processes the bench starts and stops: the operator, the gateway and the counting
proxy, each scoped to the bench's namespaces, each logging to a file of the run."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from sandpod_testkit import components
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.processes import ChildProcess, free_port, http_ok

from sandpod_bench.procstat import ProcessSample, sample

BENCH_DIR = REPO_ROOT / "benchmarks"
# The bench's cluster is busy: start and stop may take longer than in the tests.
START_SECONDS = 90
STOP_SECONDS = 20


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


class OperatorProcess(components.OperatorProcess):
    """The operator, with its Prometheus metrics on a port of its own."""

    start_seconds = START_SECONDS
    stop_seconds = STOP_SECONDS

    def __init__(
        self,
        *,
        kubeconfig: Path,
        namespaces: list[str],
        log_path: Path,
        runtime_class: str | None = None,
        runner_ingress_from: list[dict[str, Any]] | None = None,
        direct_token_file: Path | None = None,
    ) -> None:
        self.metrics_port = free_port()
        self.direct_port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "SANDPOD_METRICS_PORT": str(self.metrics_port),
            "SANDPOD_DIRECT_PORT": str(self.direct_port),
            "SANDPOD_DIRECT_TOKEN_FILE": str(direct_token_file or ""),
        }
        if runtime_class:
            env["SANDPOD_RUNTIME_CLASS_NAME"] = runtime_class
        if runner_ingress_from:
            env["SANDPOD_RUNNER_INGRESS_FROM"] = json.dumps(runner_ingress_from)
        super().__init__(env=env, namespaces=namespaces, log_path=log_path)

    @property
    def direct_url(self) -> str:
        """Its direct path (on when started with a token file)."""
        return f"http://127.0.0.1:{self.direct_port}"

    def sample(self) -> ProcessSample:
        return sample(self.pid)

    def own_requests(self) -> tuple[float, float]:
        """(requests, finished executions) from the operator's own counters: the requests it
        makes itself for executions (kopf's watches and bookkeeping not included)."""
        text = http_text(f"http://127.0.0.1:{self.metrics_port}/metrics")
        total = finished = 0.0
        for family in text_string_to_metric_families(text):
            if family.name == "sandpod_operator_api_requests_per_execution":
                for metric in family.samples:
                    if metric.name.endswith("_sum"):
                        total = metric.value
                    elif metric.name.endswith("_count"):
                        finished = metric.value
        return total, finished


class GatewayProcess(components.GatewayProcess):
    start_seconds = START_SECONDS
    stop_seconds = STOP_SECONDS


class ProxyProcess(ChildProcess):
    """The counting API proxy (sandpod_bench.proxy)."""

    stop_seconds = STOP_SECONDS

    def __init__(self, *, kubeconfig: Path, log_path: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(BENCH_DIR)}
        command = [
            sys.executable,
            "-m",
            "sandpod_bench.proxy",
            "--kubeconfig",
            str(kubeconfig),
            "--port",
            str(self.port),
        ]
        super().__init__("the counting proxy", command, env, log_path)

    def start(self) -> None:
        self.spawn()
        self.wait_ready(
            lambda: http_ok(f"http://127.0.0.1:{self.port}/.bench/counts"),
            timeout=30,
            what="the counting proxy",
        )

    def counts(self) -> dict[str, int]:
        parsed = json.loads(http_text(f"http://127.0.0.1:{self.port}/.bench/counts"))
        return {str(key): int(value) for key, value in parsed.items()}
