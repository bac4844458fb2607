"""SandboxPools on the cluster, for the suites that use them (test_pools, test_warm,
test_sessions, test_chart_settings): a fresh namespace that cleans its pools up, a pool
started and waited for, and what its status and pods say."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client
from sandpod_contract.names import POOL_LABEL, POOL_PLURAL, POOL_STATE_LABEL, SESSION_PLURAL
from sandpod_testkit.kube import GROUP, VERSION, create_namespace
from sandpod_testkit.waiting import wait_until

FILL_TIMEOUT = 180
POOL = "py"


@contextmanager
def fresh_pool_namespace(
    prefix: str, core_v1: client.CoreV1Api, custom_objects: client.CustomObjectsApi
) -> Iterator[str]:
    """A namespace named after ``prefix`` with a random tail, cleaned up as
    :func:`namespace_with_pools` does."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    with namespace_with_pools(name, core_v1, custom_objects):
        yield name


@contextmanager
def namespace_with_pools(
    name: str, core_v1: client.CoreV1Api, custom_objects: client.CustomObjectsApi
) -> Iterator[None]:
    """A fresh namespace; its pools and sessions are deleted (while the operator runs, as
    they carry its finalizer) before it."""
    create_namespace(core_v1, name)
    yield
    for plural in (SESSION_PLURAL, POOL_PLURAL):
        custom_objects.delete_collection_namespaced_custom_object(GROUP, VERSION, name, plural)
        wait_until(
            lambda plural=plural: not objects_in(custom_objects, name, plural),
            timeout=60,
            what=f"the {plural} in {name} to be deleted",
        )
    core_v1.delete_namespace(name, propagation_policy="Background", grace_period_seconds=0)


def objects_in(objects: client.CustomObjectsApi, namespace: str, plural: str) -> list[Any]:
    listed: Any = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    return list(listed["items"])


def start_pool(
    objects: client.CustomObjectsApi, namespace: str, size: int, name: str = POOL, **spec: Any
) -> None:
    """A SandboxPool `name` of `size` sandboxes (Python unless ``spec`` says otherwise), once
    they are all ready."""
    pool = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {"language": "python", "size": size, **spec},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, POOL_PLURAL, pool)
    wait_until(
        lambda: pool_counts(objects, namespace, name) == (size, size),
        timeout=FILL_TIMEOUT,
        what=f"the pool {name} to have {size} ready pods",
        interval=0.5,
    )


def pool_counts(objects: client.CustomObjectsApi, namespace: str, name: str) -> tuple[int, int]:
    pool: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, POOL_PLURAL, name)
    status = pool.get("status") or {}
    return int(status.get("ready") or 0), int(status.get("total") or 0)


def pods_in_state(core: client.CoreV1Api, namespace: str, pool: str, state: str) -> list[Any]:
    selector = f"{POOL_LABEL}={pool},{POOL_STATE_LABEL}={state}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [pod for pod in pods if pod.metadata.deletion_timestamp is None]


def wait_for_refill(core: client.CoreV1Api, namespace: str, pool: str, used: str) -> None:
    """Until the pool has a Ready free pod other than `used` (one that retired after its run:
    the pool's status may still count it for a moment)."""

    def ready(pod: Any) -> bool:
        conditions = pod.status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def refilled() -> bool:
        free = pods_in_state(core, namespace, pool, "free")
        return any(pod.metadata.name != used and ready(pod) for pod in free)

    wait_until(refilled, timeout=FILL_TIMEOUT, what=f"the {pool} pool to refill", interval=0.5)
