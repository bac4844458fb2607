"""sandpod's operator and gateway as child processes on this machine, against the cluster a
kubeconfig names; both can be killed and started again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sandpod_testkit.processes import ChildProcess, free_port, http_ok


class OperatorProcess(ChildProcess):
    """`kopf run -m sandpod_operator.handlers --standalone`, watching the namespaces that match
    `namespaces`; started, it answers on its liveness endpoint."""

    start_seconds: float = 60

    def __init__(self, *, env: dict[str, str], namespaces: list[str], log_path: Path) -> None:
        super().__init__("the operator", [], env, log_path)
        self.namespaces = namespaces

    def start(self) -> None:
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        self.command = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "-m",
            "sandpod_operator.handlers",
            "--standalone",
            *(f"--namespace={pattern}" for pattern in self.namespaces),
            f"--liveness={liveness}",
        ]
        self.spawn()
        self.wait_ready(
            lambda: http_ok(liveness, timeout=1),
            timeout=self.start_seconds,
            what="the operator's liveness endpoint",
        )


class GatewayProcess(ChildProcess):
    """`uvicorn sandpod_gateway.main:create_app --factory` on a port of its own (kept across
    restarts, so clients can retry through one), reading tenants from the Secret
    `keys_secret` in `keys_namespace`."""

    start_seconds: float = 60

    def __init__(
        self,
        *,
        kubeconfig: Path,
        keys_namespace: str,
        keys_secret: str,
        log_path: Path,
        settings: dict[str, str] | None = None,
        access_log: bool = True,
    ) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "SANDPOD_GATEWAY_KUBECONFIG": str(kubeconfig),
            "SANDPOD_GATEWAY_API_KEYS_NAMESPACE": keys_namespace,
            "SANDPOD_GATEWAY_API_KEYS_SECRET": keys_secret,
            **(settings or {}),
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
            *([] if access_log else ["--no-access-log"]),
        ]
        super().__init__("the gateway", command, env, log_path)
        self.keys_namespace = keys_namespace

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.spawn()
        self.wait_ready(
            lambda: http_ok(f"{self.url}/readyz", timeout=5),
            timeout=self.start_seconds,
            what="the gateway's /readyz",
        )
