"""Child processes the tests and the bench start (the operator, the gateway, a proxy, etcd,
kube-apiserver): each logs to a file, can be stopped gently or killed, and says why it died."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.waiting import wait_until


class ProcessExited(RuntimeError):
    """A child process ended while it was expected to run."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_ok(url: str, timeout: float = 2) -> bool:
    """Whether GET `url` answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except OSError:
        return False


class ChildProcess:
    """`command` as a child process logging (stdout and stderr) to `log_path`; stopped with
    SIGTERM, then SIGKILL after `stop_seconds`."""

    stop_seconds: float = 15

    def __init__(
        self, name: str, command: list[str], env: dict[str, str] | None, log_path: Path
    ) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
            )

    def wait_ready(self, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Waits until `ready()`; fails at once, with the log's tail, if the process ends."""

        def alive_and_ready() -> bool:
            self.check_alive()
            return ready()

        wait_until(alive_and_ready, timeout=timeout, what=what)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.process.returncode if self.process else None
            raise ProcessExited(f"{self.name} exited ({code}):\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as when a node dies or the OOM killer strikes."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=self.stop_seconds)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
