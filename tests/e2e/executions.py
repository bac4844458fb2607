"""CodeExecutions on a real cluster: create, read and wait for them; Events; kubectl, and
admission policies applied for the length of a test."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from sandpod_testkit.kube import GROUP, PLURAL, VERSION, is_gone
from sandpod_testkit.waiting import wait_until

TERMINAL = {"Succeeded", "Failed", "TimedOut", "Error", "Cancelled"}
# gVisor starts an interpreter in about a second; image unpack and scheduling add a few more.
RUN_TIMEOUT = 90
# A session run's record is written behind its answer: how long a test waits to read it.
RECORD_TIMEOUT = 30

Execution = dict[str, Any]


def manifest(name: str, spec: dict[str, Any]) -> Execution:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CodeExecution",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(objects: client.CustomObjectsApi, namespace: str, name: str, **spec: Any) -> Execution:
    body = manifest(name, spec)
    return cast(
        Execution, objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    )


def create_refused(objects: client.CustomObjectsApi, namespace: str, name: str, **spec: Any) -> str:
    """Creates an execution the API server must refuse (422, e.g. from the chart's admission
    policies); returns the refusal's message. Nothing is created."""
    try:
        create(objects, namespace, name, **spec)
    except client.ApiException as error:
        assert error.status == 422, (error.status, error.body)
        assert get(objects, namespace, name) is None
        return str(json.loads(error.body)["message"])
    raise AssertionError(f"the API server accepted {namespace}/{name}")


def get(objects: client.CustomObjectsApi, namespace: str, name: str) -> Execution | None:
    try:
        return cast(
            Execution, objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def wait_for(
    objects: client.CustomObjectsApi,
    namespace: str,
    name: str,
    phases: set[str] = TERMINAL,
    timeout: float = RUN_TIMEOUT,
) -> Execution:
    def reached() -> Execution | None:
        execution = get(objects, namespace, name)
        phase = ((execution or {}).get("status") or {}).get("phase")
        return execution if phase in phases else None

    return wait_until(reached, timeout=timeout, what=f"{namespace}/{name} to reach {phases}")


def status(execution: Execution) -> dict[str, Any]:
    return dict(execution.get("status") or {})


def run_to_end(
    objects: client.CustomObjectsApi, namespace: str, name: str, **spec: Any
) -> dict[str, Any]:
    """The status of a new execution `name` of `spec` once it has ended."""
    create(objects, namespace, name, **spec)
    return status(wait_for(objects, namespace, name))


def conditions(execution: Execution) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status(execution).get("conditions", [])}


def pod_gone(core: client.CoreV1Api, namespace: str, name: str) -> Callable[[], bool]:
    return lambda: is_gone(lambda: core.read_namespaced_pod(name, namespace))


def events_about(core: client.CoreV1Api, namespace: str, kind: str, name: str) -> list[Any]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    return list(core.list_namespaced_event(namespace, field_selector=selector).items)


def kubectl(kubeconfig: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        timeout=60,
        check=False,
    )


@contextlib.contextmanager
def applied_policy(
    kubeconfig: Path, rendered: str, *, takes_effect: Callable[[], bool], what: str
) -> Iterator[None]:
    """`kubectl apply` of rendered manifests (an admission policy and its binding), waited for
    until `takes_effect()` (the API server picks policies up within seconds), deleted after."""
    applied = kubectl(kubeconfig, "apply", "-f", "-", stdin=rendered)
    assert applied.returncode == 0, applied.stderr
    try:
        wait_until(takes_effect, timeout=60, what=what)
        yield
    finally:
        kubectl(kubeconfig, "delete", "--ignore-not-found", "-f", "-", stdin=rendered)
