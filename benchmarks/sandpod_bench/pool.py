"""The pool sections' helpers: the bench's SandboxPool, and the node address the operator's
traffic to the runners comes from."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from sandpod_contract.names import GROUP, POOL_PLURAL, VERSION

from sandpod_bench import manifests

POOL_NAME = "bench"


def create_pool(
    custom: client.CustomObjectsApi, namespace: str, size: int, *, sessions: bool = False
) -> None:
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        POOL_PLURAL,
        manifests.sandbox_pool(POOL_NAME, size, sessions=sessions),
    )


def pool_ready(custom: client.CustomObjectsApi, namespace: str) -> tuple[int, int]:
    """(ready, size) of the bench's pool."""
    pool: Any = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, POOL_PLURAL, POOL_NAME
    )
    status = pool.get("status") or {}
    return int(status.get("ready") or 0), int(pool["spec"]["size"])


def wait_pool_full(custom: client.CustomObjectsApi, namespace: str, timeout: float) -> bool:
    """Whether the pool has `size` ready pods within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, size = pool_ready(custom, namespace)
        if ready >= size:
            return True
        time.sleep(0.5)
    return False


def node_address(core: client.CoreV1Api) -> str:
    """The node's InternalIP: the bench's operator runs on this machine, so its connections
    to the runners come from there (the runner-ingress policy must admit it)."""
    node: Any = core.list_node().items[0]
    return str(next(a.address for a in node.status.addresses if a.type == "InternalIP"))
