"""The pool sections' helpers: the bench's SandboxPool, the node address the operator's
traffic to the runners comes from, and the operator's per-run timing lines."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kubernetes import client
from sandpod_contract.names import GROUP, POOL_PLURAL, VERSION
from sandpod_operator.warm import TIMINGS_LOG

from sandpod_bench import manifests

POOL_NAME = "bench"
# Prefix of the operator's marks in a warm timeline (breakdown.WARM_MILESTONES).
MARK_PREFIX = "op_"


def create_pool(custom: client.CustomObjectsApi, namespace: str, size: int) -> None:
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, POOL_PLURAL, manifests.sandbox_pool(POOL_NAME, size)
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


def parse_marks(lines: Iterable[str]) -> dict[tuple[str, str], dict[str, float]]:
    """(namespace, name) -> the operator's marks of its warm run (pure), `op_`-prefixed."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for line in lines:
        _, marker, rest = line.partition(TIMINGS_LOG + " ")
        if not marker:
            continue
        where, _, document = rest.strip().partition(" ")
        namespace, _, name = where.partition("/")
        try:
            marks = json.loads(document)
        except ValueError:
            continue
        if isinstance(marks, dict):
            found[(namespace, name)] = {
                MARK_PREFIX + str(key): float(value)
                for key, value in marks.items()
                if isinstance(value, int | float)
            }
    return found


def operator_marks(log_path: Path) -> dict[tuple[str, str], dict[str, float]]:
    if not log_path.exists():
        return {}
    with log_path.open(errors="replace") as lines:
        return parse_marks(lines)
