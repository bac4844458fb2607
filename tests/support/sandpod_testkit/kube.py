"""sandpod on a real cluster, through the official (synchronous) Kubernetes client: the CRDs
applied and served, namespaces ready for pods, executions deleted before their namespace, and
the cluster's own addresses."""

from __future__ import annotations

import ipaddress
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


# The local cluster's pod network (hack/cluster/lib.sh): its node carries no podCIDR.
LOCAL_POD_CIDR = "10.244.0.0/24"


def api_server_cidrs(api_client: client.ApiClient) -> tuple[list[str], list[int]]:
    """The API server's addresses and ports, as pods reach them after kube-proxy's DNAT."""
    slices: Any = client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice(
        "default", label_selector="kubernetes.io/service-name=kubernetes"
    )
    addresses = {
        address
        for item in slices.items
        for endpoint in item.endpoints
        for address in endpoint.addresses
    }
    ports = {port.port for item in slices.items for port in item.ports}
    assert addresses and ports, "the kubernetes Service has no endpoints"
    return [f"{address}/32" for address in sorted(addresses)], sorted(ports)


def cluster_ranges(api_client: client.ApiClient) -> dict[str, list[str]]:
    """The cluster's own ranges, as an administrator lists them for the egress bounds:
    nodes, pods, services, apiServer."""
    nodes: Any = client.CoreV1Api(api_client).list_node().items
    node_addresses = {
        address.address
        for node in nodes
        for address in node.status.addresses
        if address.type == "InternalIP"
    }
    services: Any = client.NetworkingV1Api(api_client).list_service_cidr().items
    return {
        "nodes": sorted(str(ipaddress.ip_network(address)) for address in node_addresses),
        "pods": sorted({cidr for node in nodes for cidr in node.spec.pod_cidrs or []})
        or [LOCAL_POD_CIDR],
        "services": sorted({cidr for item in services for cidr in item.spec.cidrs}),
        "apiServer": api_server_cidrs(api_client)[0],
    }
