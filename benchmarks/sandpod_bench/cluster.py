"""The machine and the cluster around the bench: facts for the report, what else runs there,
the bench's namespaces, and removing what it made (also what an interrupted bench left)."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from sandpod_contract.names import FINALIZER, GROUP, PLURAL, POOL_PLURAL, SESSION_PLURAL, VERSION
from urllib3.exceptions import HTTPError

from sandpod_bench import manifests
from sandpod_bench.kube import list_raw
from sandpod_bench.processes import OperatorProcess

CLEANUP_SECONDS = 180
BENCH_LABELS = {manifests.PART_OF_LABEL: manifests.PART_OF}
# What carries the operator's finalizer: executions, pools and sessions.
FINALIZED_PLURALS = (PLURAL, POOL_PLURAL, SESSION_PLURAL)


class BenchError(RuntimeError):
    pass


def progress(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def machine_facts(api: client.ApiClient) -> dict[str, Any]:
    cpu_model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    version = client.VersionApi(api).get_code()
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "kubernetes": version.git_version,
        "python": platform.python_version(),
    }


def api_server_answers(api: client.ApiClient, timeout: float) -> bool:
    """Whether /version answers within `timeout` (other sessions may be restarting it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.VersionApi(api).get_code()
            return True
        except (client.ApiException, HTTPError):
            if time.monotonic() > deadline:
                return False
            progress("waiting for the API server")
            time.sleep(2)


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def other_activity(core: client.CoreV1Api, prefix: str) -> dict[str, int]:
    """What else runs on the cluster (other people's tests make the numbers noisy)."""
    pods = list_raw(core.list_pod_for_all_namespaces)["items"]
    others = [p["metadata"]["namespace"] for p in pods]
    others = [namespace for namespace in others if not namespace.startswith(prefix)]
    return {
        "pods": len(others),
        "pods_outside_kube_system": sum(1 for ns in others if ns != "kube-system"),
    }


def ensure_runtime_class(api: client.ApiClient, name: str) -> None:
    try:
        client.NodeV1Api(api).read_runtime_class(name)
    except client.ApiException as error:
        if error.status == 404:
            raise BenchError(f"the cluster has no RuntimeClass {name!r}") from error
        raise


# The soak section's tenants: two quiet ones and an abusive one, each a namespace of its own.
SOAK_TENANTS = ("soak-a", "soak-b", "soak-abuse")


class _Namespace:
    """A namespace of the run, named after its attribute: the prefix, a dash, the name with
    dashes for underscores (`judge0_cold`: `<prefix>-judge0-cold`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.suffix = name.replace("_", "-")

    def __get__(self, namespaces: Namespaces, owner: type | None = None) -> str:
        return f"{namespaces.prefix}-{self.suffix}"


@dataclass
class Namespaces:
    prefix: str
    soak: bool = False  # with the soak section's tenants

    kubectl = _Namespace()
    gateway = _Namespace()
    load = _Namespace()
    baselines = _Namespace()
    cost = _Namespace()
    pool = _Namespace()
    session = _Namespace()
    e2b = _Namespace()
    judge0_cold = _Namespace()
    judge0_pool = _Namespace()

    @property
    def soak_tenants(self) -> dict[str, str]:
        """The soak section's tenants and their namespaces (none without the section)."""
        return {tenant: f"{self.prefix}-{tenant}" for tenant in SOAK_TENANTS if self.soak}

    @property
    def sandpod(self) -> list[str]:
        """Those the main operator watches."""
        return [
            self.kubectl,
            self.gateway,
            self.load,
            self.pool,
            self.session,
            self.e2b,
            self.judge0_cold,
            self.judge0_pool,
            *self.soak_tenants.values(),
        ]


def delete_executions(
    custom: client.CustomObjectsApi, namespaces: Sequence[str], operator: OperatorProcess
) -> None:
    """Delete every execution and pool while the operator still runs (it releases its
    finalizer); what is left when the operator is gone or after CLEANUP_SECONDS loses the
    finalizer by force. Survives an API server that is briefly away (other sessions restart
    it)."""
    deadline = time.monotonic() + CLEANUP_SECONDS
    requested: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        try:
            left = 0
            for namespace in namespaces:
                for plural in FINALIZED_PLURALS:
                    if (namespace, plural) not in requested:
                        custom.delete_collection_namespaced_custom_object(
                            GROUP, VERSION, namespace, plural
                        )
                        requested.add((namespace, plural))
                    listed: Any = custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural
                    )
                    left += len(listed["items"])
        except (client.ApiException, HTTPError) as error:
            progress(f"clean-up: the API server failed ({type(error).__name__}), retrying")
            time.sleep(2)
            continue
        if not left:
            return
        if not operator.alive():
            break
        time.sleep(1)
    release_finalizers(custom, namespaces)


def release_finalizers(custom: client.CustomObjectsApi, namespaces: Sequence[str]) -> None:
    """Remove the operator's finalizer from every execution and pool left in `namespaces`."""
    for namespace in namespaces:
        for plural in FINALIZED_PLURALS:
            try:
                remaining: Any = custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural
                )
                for item in remaining["items"]:
                    finalizers = [
                        f for f in item["metadata"].get("finalizers") or [] if f != FINALIZER
                    ]
                    custom.patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        namespace,
                        plural,
                        item["metadata"]["name"],
                        {"metadata": {"finalizers": finalizers or None}},
                    )
            except (client.ApiException, HTTPError) as error:
                progress(f"could not release the {plural} in {namespace}: {error}")


def delete_namespaces(core: client.CoreV1Api, namespaces: Sequence[str]) -> None:
    for namespace in namespaces:
        try:
            core.delete_namespace(namespace, propagation_policy="Background")
        except client.ApiException as error:
            if error.status != 404:
                progress(f"could not delete namespace {namespace}: {error.reason}")
        except HTTPError as error:
            progress(f"could not delete namespace {namespace}: {error}")


def clean_up_leftovers(api: client.ApiClient) -> list[str]:
    """Namespaces an interrupted bench left behind (labelled as the bench's): their
    executions lose the finalizer (no operator runs for them any more), then they go."""
    core = client.CoreV1Api(api)
    selector = f"{manifests.PART_OF_LABEL}={manifests.PART_OF}"
    names = [
        item["metadata"]["name"]
        for item in list_raw(core.list_namespace, label_selector=selector)["items"]
    ]
    release_finalizers(client.CustomObjectsApi(api), names)
    delete_namespaces(core, names)
    return names


@contextmanager
def running(process: Any) -> Iterator[Any]:
    process.start()
    try:
        yield process
    finally:
        process.stop()
