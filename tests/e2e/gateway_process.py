"""A locally running sandpod gateway (uvicorn) for end-to-end tests, with its keys Secret.

It can be killed and started again on the same port, so clients can retry through a restart.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kube_helpers import wait_until
from kubernetes import client

REPO_ROOT = Path(__file__).resolve().parents[2]
KEYS_SECRET = "sandpod-api-keys"
# Pod start under gVisor plus the program; generous, the tests never wait this long on success.
REQUEST_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Gateway:
    """`uvicorn sandpod_gateway.main:create_app --factory` as a child process, reading tenants
    from the Secret KEYS_SECRET in `keys_namespace` (which must exist)."""

    def __init__(
        self, kubeconfig_path: Path, keys_namespace: str, core_v1: client.CoreV1Api, log_path: Path
    ) -> None:
        self.keys_namespace = keys_namespace
        self.core_v1 = core_v1
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SANDPOD_GATEWAY_KUBECONFIG": str(kubeconfig_path),
            "SANDPOD_GATEWAY_API_KEYS_NAMESPACE": keys_namespace,
            "SANDPOD_GATEWAY_API_KEYS_SECRET": KEYS_SECRET,
            "SANDPOD_GATEWAY_API_KEYS_REFRESH_SECONDS": "1",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "sandpod_gateway.main:create_app", "--factory",
                 "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
            )  # fmt: skip

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"the gateway exited ({self.process.returncode}):\n{self.log_tail()}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=60, what="the gateway's /readyz")

    def kill(self) -> None:
        """SIGKILL: requests in flight are cut off, as when the gateway's pod dies."""
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

    def add_tenant(self, name: str, namespace: str, **limits: Any) -> str:
        """A new API key for tenant `name`; returns once the gateway accepts it."""
        key = f"sk-{secrets.token_urlsafe(24)}"
        secret = self.core_v1.read_namespaced_secret(KEYS_SECRET, self.keys_namespace)
        tenants = yaml.safe_load(base64.b64decode(secret.data["tenants.yaml"]).decode()) or {}
        tenants.setdefault("tenants", {})[name] = {
            "namespace": namespace,
            "limits": limits,
            "apiKeys": [{"name": "e2e", "sha256": hashlib.sha256(key.encode()).hexdigest()}],
        }
        self.core_v1.patch_namespaced_secret(
            KEYS_SECRET,
            self.keys_namespace,
            {"stringData": {"tenants.yaml": yaml.safe_dump(tenants)}},
        )
        with self.client(key) as probe:
            wait_until(
                lambda: probe.get("/v1/languages").status_code == 200,
                timeout=30,
                what=f"the gateway to accept the key of tenant {name}",
            )
        return key

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=REQUEST_TIMEOUT,
        )

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def create_keys_secret(core_v1: client.CoreV1Api, namespace: str) -> None:
    core_v1.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=KEYS_SECRET),
            string_data={"tenants.yaml": "tenants: {}\n"},
        ),
    )
