"""A locally running sandpod operator for end-to-end tests, and the settings it runs with."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from kube_helpers import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
KOPF = REPO_ROOT / ".venv" / "bin" / "kopf"
# Settings the operator's own e2e tests rely on: a RuntimeClass that the operator allows but
# the cluster lacks, a language whose image does not exist, memory limits above the node's.
MISSING_RUNTIME_CLASS = "sandpod-missing-runtime"
MISSING_IMAGE_LANGUAGE = "missing-image"
MISSING_IMAGE = "localhost/sandpod/does-not-exist:0.0.0"


class OperatorProcess:
    """`kopf run -m sandpod_operator.handlers` as a child process that tests can kill -9."""

    def __init__(self, env: dict[str, str], log_path: Path, namespaces: list[str]) -> None:
        self.env = env
        self.log_path = log_path
        self.namespaces = namespaces
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                str(KOPF),
                "run",
                "-m",
                "sandpod_operator.handlers",
                *(f"--namespace={pattern}" for pattern in self.namespaces),
                "--standalone",
                f"--liveness=http://127.0.0.1:{port}/healthz",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
        log.close()

        def alive() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"the operator exited ({self.process.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return True
            except OSError:
                return False

        wait_until(alive, timeout=60, what="the operator's liveness endpoint")

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies or the OOM killer strikes."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
