"""The processes the bench starts and stops: the operator, the gateway and the counting
proxy, each scoped to the bench's namespace, each logging to a file of the run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sandpod_bench.procstat import ProcessSample, sample

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "benchmarks"
VENV_BIN = REPO_ROOT / ".venv" / "bin"


class StartupError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise StartupError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 200 <= int(response.status) < 300
    except OSError:
        return False


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


class ChildProcess:
    """A child process logging to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.process.returncode if self.process else None
            raise StartupError(f"{self.name} exited ({code}):\n{self.log_tail()}")

    def sample(self) -> ProcessSample:
        return sample(self.pid)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class OperatorProcess(ChildProcess):
    """`kopf run -m sandpod_operator.handlers --standalone --namespace=<ns>...`, with its
    Prometheus metrics on a port of its own."""

    def __init__(self, *, kubeconfig: Path, namespaces: list[str], log_path: Path) -> None:
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "SANDPOD_METRICS_PORT": str(self.metrics_port),
        }
        command = [
            str(VENV_BIN / "kopf"),
            "run",
            "-m",
            "sandpod_operator.handlers",
            "--standalone",
            *(f"--namespace={namespace}" for namespace in namespaces),
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
        ]
        super().__init__("the operator", command, env, log_path)

    def start(self) -> None:
        self.spawn()

        def live() -> bool:
            self.check_alive()
            return http_ok(f"http://127.0.0.1:{self.liveness_port}/healthz")

        wait_for(live, timeout=90, what="the operator's liveness endpoint")

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


class GatewayProcess(ChildProcess):
    """`uvicorn sandpod_gateway.main:create_app --factory`, its keys Secret in `namespace`."""

    def __init__(self, *, kubeconfig: Path, namespace: str, secret: str, log_path: Path) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "SANDPOD_GATEWAY_KUBECONFIG": str(kubeconfig),
            "SANDPOD_GATEWAY_API_KEYS_NAMESPACE": namespace,
            "SANDPOD_GATEWAY_API_KEYS_SECRET": secret,
        }
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "sandpod_gateway.main:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-access-log",
        ]
        super().__init__("the gateway", command, env, log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.spawn()

        def ready() -> bool:
            self.check_alive()
            return http_ok(f"{self.url}/readyz")

        wait_for(ready, timeout=90, what="the gateway's /readyz")


class ProxyProcess(ChildProcess):
    """The counting API proxy (sandpod_bench.proxy)."""

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

        def up() -> bool:
            self.check_alive()
            return http_ok(f"http://127.0.0.1:{self.port}/.bench/counts")

        wait_for(up, timeout=30, what="the counting proxy")

    def counts(self) -> dict[str, int]:
        parsed = json.loads(http_text(f"http://127.0.0.1:{self.port}/.bench/counts"))
        return {str(key): int(value) for key, value in parsed.items()}
