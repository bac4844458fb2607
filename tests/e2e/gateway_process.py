"""The gateway the cluster tests run on this machine, with its keys Secret: tests add tenants
and talk to it with their keys. It can be killed and started again on the same port, so
clients can retry through a restart."""

from __future__ import annotations

import base64
import hashlib
import secrets
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from sandpod_testkit.components import GatewayProcess
from sandpod_testkit.waiting import wait_until

KEYS_SECRET = "sandpod-api-keys"
# Pod start under gVisor plus the program; generous, the tests never wait this long on success.
REQUEST_TIMEOUT = 180.0


class Gateway(GatewayProcess):
    """The gateway reading tenants from the Secret KEYS_SECRET in `keys_namespace` (which must
    exist), refreshed every second."""

    def __init__(
        self, kubeconfig_path: Path, keys_namespace: str, core_v1: client.CoreV1Api, log_path: Path
    ) -> None:
        super().__init__(
            kubeconfig=kubeconfig_path,
            keys_namespace=keys_namespace,
            keys_secret=KEYS_SECRET,
            log_path=log_path,
            settings={"SANDPOD_GATEWAY_API_KEYS_REFRESH_SECONDS": "1"},
        )
        self.core_v1 = core_v1

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


def create_keys_secret(core_v1: client.CoreV1Api, namespace: str) -> None:
    core_v1.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=KEYS_SECRET),
            string_data={"tenants.yaml": "tenants: {}\n"},
        ),
    )
