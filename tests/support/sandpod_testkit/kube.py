"""sandpod on a real cluster, through the official (synchronous) Kubernetes client: the CRDs
applied and served, namespaces ready for pods, executions deleted before their namespace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client

from sandpod_testkit.paths import CRD_PATH, CRDS_DIR
from sandpod_testkit.waiting import wait_until

CRD: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
GROUP: str = CRD["spec"]["group"]
VERSION: str = next(v["name"] for v in CRD["spec"]["versions"] if v.get("storage"))
PLURAL: str = CRD["spec"]["names"]["plural"]


def is_gone(read: Callable[[], object]) -> bool:
    """Whether `read()` answers 404; other errors are raised."""
    try:
        read()
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def ensure_crd(api: client.ApiClient, *, timeout: float = 30) -> str:
    """Applies crds/ (every CRD: create, or replace what is there) and waits until the API
    server serves each kind; returns the CodeExecution CRD's name."""
    for path in sorted(CRDS_DIR.glob("*.yaml")):
        _apply_crd(api, yaml.safe_load(path.read_text()), timeout)
    return str(CRD["metadata"]["name"])


def _apply_crd(api: client.ApiClient, manifest: Any, timeout: float) -> None:
    extensions = client.ApiextensionsV1Api(api)
    name = str(manifest["metadata"]["name"])
    try:
        extensions.create_custom_resource_definition(manifest)
    except client.ApiException as error:
        if error.status != 409:
            raise
        current: Any = extensions.read_custom_resource_definition(name)
        manifest["metadata"]["resourceVersion"] = current.metadata.resource_version
        extensions.replace_custom_resource_definition(name, manifest)

    def established() -> bool:
        crd: Any = extensions.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        return conditions.get("Established") == "True"

    wait_until(established, timeout=timeout, what=f"CRD {name} to be established")
    objects = client.CustomObjectsApi(api)
    plural = manifest["spec"]["names"]["plural"]
    wait_until(
        lambda: (
            not is_gone(lambda: objects.list_cluster_custom_object(GROUP, VERSION, plural, limit=1))
        ),
        timeout=timeout,
        what=f"{name} to be served",
    )


def create_namespace(
    core: client.CoreV1Api, name: str, *, labels: dict[str, str] | None = None, timeout: float = 30
) -> None:
    """Creates a namespace and waits until pods can be made there: the controller manager
    makes its default service account, and on a busy cluster it lags."""
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    wait_until(
        lambda: not is_gone(lambda: core.read_namespaced_service_account("default", name)),
        timeout=timeout,
        what=f"the default service account in {name}",
    )


def request_deletion(objects: client.CustomObjectsApi, namespace: str) -> None:
    """Asks for every execution in `namespace` to be deleted (the operator releases them)."""
    objects.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)


def executions_left(objects: client.CustomObjectsApi, namespace: str) -> int:
    listed: Any = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    return len(listed["items"])


def delete_executions(objects: client.CustomObjectsApi, namespace: str, timeout: float) -> None:
    """Deletes every execution in `namespace` and waits until the operator has let them go.

    Do this before deleting a namespace: kopf stops serving a namespace once it is
    terminating, so executions deleted only with their namespace may keep the operator's
    finalizer (and the namespace) forever.
    """
    request_deletion(objects, namespace)
    wait_until(
        lambda: not executions_left(objects, namespace),
        timeout=timeout,
        what=f"the executions in {namespace} to be deleted",
    )
