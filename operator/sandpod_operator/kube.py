"""The operator's own Kubernetes API calls: thin, dict-in/dict-out, and counted.

kopf watches and patches its own bookkeeping; everything else the operator does to the
cluster goes through `Kube`, which counts requests per verb and resource (Prometheus) and
per execution (logged when the execution finishes).
"""

import json
from collections import Counter as Tally
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client as k8s
from prometheus_client import Counter, Histogram
from sandpod_contract.names import (
    FINISHED_LABEL,
    GROUP,
    PLURAL,
    POOL_LABEL,
    POOL_PLURAL,
    QUEUED_LABEL,
    RESYNC_ANNOTATION,
    SESSION_PLURAL,
    VERSION,
)
from sandpod_contract.runner import LogReader, LogSummary, Summary

Manifest = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)

REQUEST_TIMEOUT_SECONDS = 30
LOG_TIMEOUT_SECONDS = 120
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class LogRead:
    """A read of a sandbox pod's log: verified against the runner's summary, at most
    `limit_bytes` fetched, memory bounded by `tail_bytes`, `files_bytes` of output files kept."""

    namespace: str
    name: str
    uid: str | None
    summary: Summary
    tail_bytes: int
    limit_bytes: int
    files_bytes: int = 0

    def reader(self) -> LogReader:
        return LogReader(self.tail_bytes, self.summary, self.files_bytes)


API_REQUESTS = Counter(
    "sandpod_operator_api_requests_total",
    "Kubernetes API requests made by the operator (besides kopf's watches and bookkeeping).",
    ["verb", "resource"],
)
REQUESTS_PER_EXECUTION = Histogram(
    "sandpod_operator_api_requests_per_execution",
    "API requests the operator made for one execution, from creation to its terminal status.",
    buckets=(2, 4, 6, 8, 10, 12, 16, 20, 30, 50),
)


@dataclass
class KubeError(Exception):
    """An API error response: HTTP status plus the Status object's reason and message."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def transient(self) -> bool:
        return self.status == 429 or self.status >= 500

    @classmethod
    def from_response(cls, status: int, body: bytes) -> "KubeError":
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
        return cls(
            status=status,
            reason=str(parsed.get("reason") or ""),
            message=str(parsed.get("message") or body[:500].decode(errors="replace")),
        )


# What an API call may raise: the API server's answer, or no answer.
TRANSIENT_ERRORS = (aiohttp.ClientError, TimeoutError)
API_ERRORS = (KubeError, *TRANSIENT_ERRORS)


class RequestCounter:
    """Counts requests per (verb, resource) and per execution uid."""

    def __init__(self) -> None:
        self._per_execution: Tally[str] = Tally()

    def count(self, verb: str, resource: str, execution_uid: str | None) -> None:
        API_REQUESTS.labels(verb=verb, resource=resource).inc()
        if execution_uid:
            self._per_execution[execution_uid] += 1

    def forget(self, execution_uid: str) -> None:
        self._per_execution.pop(execution_uid, None)

    def settle(self, execution_uid: str) -> int:
        """The count for an execution that finished; forgets it."""
        total = self._per_execution.pop(execution_uid, 0)
        REQUESTS_PER_EXECUTION.observe(total)
        return total


class KubeApi(Protocol):
    """The operator's view of the cluster: `Kube`, or an in-memory fake in unit tests."""

    counter: RequestCounter

    async def close(self) -> None: ...
    # Each create returns the object as the cluster has it: the one created, or the one that
    # already had that name (whoever made it), or None if that one vanished meanwhile.
    async def create_configmap(self, body: Manifest, *, uid: str) -> Manifest | None: ...
    async def create_network_policy(
        self, body: Manifest, *, uid: str | None
    ) -> Manifest | None: ...
    async def create_pod(self, body: Manifest, *, uid: str) -> Manifest | None: ...
    async def read_pod(self, namespace: str, name: str, *, uid: str | None) -> Manifest | None: ...
    async def delete_pod(self, namespace: str, name: str, *, uid: str | None) -> None: ...
    async def read_pod_log(self, read: LogRead) -> LogSummary: ...
    async def latest_warning(
        self, namespace: str, pod_name: str, *, uid: str | None
    ) -> str | None: ...
    async def list_pods(
        self, namespace: str, *, label_selector: str, uid: str | None
    ) -> list[Manifest]: ...
    async def patch_pod(
        self, namespace: str, name: str, *, uid: str | None, patch: Manifest
    ) -> Manifest: ...
    async def read_log_head(
        self, namespace: str, name: str, *, uid: str | None, limit_bytes: int
    ) -> bytes: ...
    async def get_execution(
        self, namespace: str, name: str, *, uid: str | None
    ) -> Manifest | None: ...
    async def create_execution(self, body: Manifest) -> Manifest: ...
    async def patch_execution_status(
        self, namespace: str, name: str, *, uid: str | None, resource_version: str, status: Manifest
    ) -> Manifest: ...
    async def read_service_ip(self, namespace: str, name: str) -> str | None: ...
    async def endpoint_addresses(self, namespace: str, service: str) -> list[str]: ...
    async def label_finished(
        self, namespace: str, name: str, *, uid: str, plural: str = PLURAL
    ) -> None: ...
    async def delete_execution(self, namespace: str, name: str, *, uid: str) -> None: ...
    async def get_session(self, namespace: str, name: str) -> Manifest | None: ...
    async def patch_session_status(
        self, namespace: str, name: str, *, resource_version: str, status: Manifest
    ) -> Manifest: ...


class PoolKubeApi(Protocol):
    """What the pool controller does to the cluster: `Kube`, or the fake in unit tests."""

    async def create_network_policy(self, body: Manifest, *, uid: str | None) -> Any: ...
    async def apply_configmap(self, body: Manifest) -> None: ...
    async def list_pool_pods(self, namespace: str, pool_name: str) -> list[Manifest]: ...
    async def create_pool_pod(self, body: Manifest) -> Manifest: ...
    async def delete_pool_pod(
        self, namespace: str, name: str, *, resource_version: str
    ) -> bool: ...
    async def patch_pool_status(self, namespace: str, name: str, status: Manifest) -> None: ...


class Kube:
    def __init__(self, api: k8s.ApiClient, counter: RequestCounter) -> None:
        self._api = api
        self._core = k8s.CoreV1Api(api)
        self._networking = k8s.NetworkingV1Api(api)
        self._discovery = k8s.DiscoveryV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self.counter = counter

    async def close(self) -> None:
        await self._api.close()

    async def _list(
        self, resource: str, method: Any, namespace: str, selector: str
    ) -> list[Manifest]:
        """The items of a namespaced list with a label selector."""
        listed = await self._call(
            "list", resource, None, method, namespace, label_selector=selector
        )
        return list(listed.get("items") or [])

    async def _call(
        self, verb: str, resource: str, uid: str | None, method: Any, *args: Any, **kwargs: Any
    ) -> Manifest:
        self.counter.count(verb, resource, uid)
        response = await method(
            *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs
        )
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status >= 400:
            raise KubeError.from_response(response.status, body)
        parsed = json.loads(body) if body else {}
        return parsed if isinstance(parsed, dict) else {}

    async def _create(
        self,
        resource: str,
        uid: str | None,
        methods: tuple[Any, Any],
        namespace: str,
        body: Manifest,
    ) -> Manifest | None:
        """Create; if the name is taken, the object that has it (the caller decides whether
        it is its own), or None if it is gone by the time it is read."""
        create, read = methods
        try:
            return await self._call("create", resource, uid, create, namespace, body)
        except KubeError as error:
            if error.status != 409 or error.reason != "AlreadyExists":
                raise
        try:
            return await self._call("get", resource, uid, read, body["metadata"]["name"], namespace)
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def create_configmap(self, body: Manifest, *, uid: str) -> Manifest | None:
        methods = (self._core.create_namespaced_config_map, self._core.read_namespaced_config_map)
        return await self._create("configmaps", uid, methods, body["metadata"]["namespace"], body)

    async def create_network_policy(self, body: Manifest, *, uid: str | None) -> Manifest | None:
        methods = (
            self._networking.create_namespaced_network_policy,
            self._networking.read_namespaced_network_policy,
        )
        namespace = body["metadata"]["namespace"]
        return await self._create("networkpolicies", uid, methods, namespace, body)

    async def create_pod(self, body: Manifest, *, uid: str) -> Manifest | None:
        methods = (self._core.create_namespaced_pod, self._core.read_namespaced_pod)
        return await self._create("pods", uid, methods, body["metadata"]["namespace"], body)

    async def read_service_ip(self, namespace: str, name: str) -> str | None:
        """The cluster IP of a Service (the egress proxy's), None while it has none."""
        try:
            service = await self._call(
                "get", "services", None, self._core.read_namespaced_service, name, namespace
            )
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        address = (service.get("spec") or {}).get("clusterIP")
        return str(address) if address and address != "None" else None

    async def endpoint_addresses(self, namespace: str, service: str) -> list[str]:
        """The ready addresses behind a Service (each replica of the egress proxy)."""
        slices = await self._list(
            "endpointslices",
            self._discovery.list_namespaced_endpoint_slice,
            namespace,
            f"kubernetes.io/service-name={service}",
        )
        return sorted(
            {
                address
                for piece in slices
                for endpoint in piece.get("endpoints") or []
                if (endpoint.get("conditions") or {}).get("ready", True)
                for address in endpoint.get("addresses") or []
            }
        )

    async def read_pod(self, namespace: str, name: str, *, uid: str | None) -> Manifest | None:
        try:
            return await self._call(
                "get", "pods", uid, self._core.read_namespaced_pod, name, namespace
            )
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def delete_pod(self, namespace: str, name: str, *, uid: str | None) -> None:
        """Delete at once (grace 0): a sandbox has nothing to shut down cleanly."""
        try:
            await self._call(
                "delete",
                "pods",
                uid,
                self._core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=0,
            )
        except KubeError as error:
            if error.status != 404:
                raise

    async def read_pod_log(self, read: LogRead) -> LogSummary:
        """Stream the pod log through a LogReader that verifies it against the runner's
        summary: memory stays bounded by `tail_bytes`."""
        log = self._pod_log(
            read.namespace, read.name, read.uid, read.limit_bytes, LOG_TIMEOUT_SECONDS
        )
        async with log as response:
            reader = read.reader()
            async for chunk in response.content.iter_chunked(64 * 1024):
                reader.feed(chunk)
            return reader.finish()

    @asynccontextmanager
    async def _pod_log(
        self, namespace: str, name: str, uid: str | None, limit_bytes: int, timeout: float
    ) -> AsyncIterator[Any]:
        """The pod log's response, streaming (not preloaded: the raw aiohttp response, though
        the client's annotation says str)."""
        self.counter.count("get", "pods/log", uid)
        response: Any = await self._core.read_namespaced_pod_log(
            name,
            namespace,
            limit_bytes=limit_bytes,
            _preload_content=False,
            _request_timeout=timeout,
        )
        try:
            if response.status >= 400:
                raise KubeError.from_response(response.status, await response.read())
            yield response
        finally:
            response.release()

    async def list_pods(
        self, namespace: str, *, label_selector: str, uid: str | None
    ) -> list[Manifest]:
        found = await self._call(
            "list",
            "pods",
            uid,
            self._core.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
        )
        return [item for item in found.get("items") or [] if isinstance(item, dict)]

    async def patch_pod(
        self, namespace: str, name: str, *, uid: str | None, patch: Manifest
    ) -> Manifest:
        """Merge-patch a pod; a metadata.resourceVersion in `patch` makes it conditional (409
        when the pod changed since)."""
        return await self._call(
            "patch",
            "pods",
            uid,
            self._core.patch_namespaced_pod,
            name,
            namespace,
            patch,
            _content_type=MERGE_PATCH,
        )

    async def read_log_head(
        self, namespace: str, name: str, *, uid: str | None, limit_bytes: int
    ) -> bytes:
        """The first `limit_bytes` of a pod's log."""
        log = self._pod_log(namespace, name, uid, limit_bytes, REQUEST_TIMEOUT_SECONDS)
        async with log as response:
            return bytes(await response.read())

    async def latest_warning(self, namespace: str, pod_name: str, *, uid: str | None) -> str | None:
        """The newest Warning event about a pod, e.g. why its sandbox cannot be created."""
        events = await self._call(
            "list",
            "events",
            uid,
            self._core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name},type=Warning",
        )
        items = events.get("items") or []
        if not items:
            return None
        newest = max(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return f"{newest.get('reason')}: {newest.get('message')}"

    async def get_execution(self, namespace: str, name: str, *, uid: str | None) -> Manifest | None:
        return await self._get_custom(PLURAL, namespace, name, uid)

    async def _get_custom(
        self, plural: str, namespace: str, name: str, uid: str | None
    ) -> Manifest | None:
        try:
            return await self._call(
                "get",
                plural,
                uid,
                self._custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
            )
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def create_execution(self, body: Manifest) -> Manifest:
        """Create a CodeExecution (a record of the direct path): the object created."""
        return await self._call(
            "create",
            PLURAL,
            None,
            self._custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            body["metadata"]["namespace"],
            PLURAL,
            body,
        )

    async def patch_execution_status(
        self, namespace: str, name: str, *, uid: str | None, resource_version: str, status: Manifest
    ) -> Manifest:
        return await self._patch_status(PLURAL, namespace, name, uid, resource_version, status)

    async def _merge_patch_custom(
        self, resource: str, namespace: str, name: str, uid: str | None, body: Manifest
    ) -> Manifest:
        """Merge-patch one of our custom objects; `resource` is its plural, or plural/status."""
        plural, _, subresource = resource.partition("/")
        method = (
            self._custom.patch_namespaced_custom_object_status
            if subresource == "status"
            else self._custom.patch_namespaced_custom_object
        )
        return await self._call(
            "patch",
            resource,
            uid,
            method,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            body,
            _content_type=MERGE_PATCH,
        )

    async def _patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        uid: str | None,
        resource_version: str,
        status: Manifest,
    ) -> Manifest:
        """Merge-patch status, only if the object is still at `resource_version` (else 409)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return await self._merge_patch_custom(f"{plural}/status", namespace, name, uid, body)

    async def get_session(self, namespace: str, name: str) -> Manifest | None:
        return await self._get_custom(SESSION_PLURAL, namespace, name, None)

    async def patch_session_status(
        self, namespace: str, name: str, *, resource_version: str, status: Manifest
    ) -> Manifest:
        return await self._patch_status(
            SESSION_PLURAL, namespace, name, None, resource_version, status
        )

    async def label_finished(
        self, namespace: str, name: str, *, uid: str, plural: str = PLURAL
    ) -> None:
        """Label this very execution (or, by `plural`, session) finished."""
        await self._patch_this(plural, namespace, name, uid, {"labels": {FINISHED_LABEL: "true"}})

    async def touch_execution(self, namespace: str, name: str, *, uid: str, at: str) -> bool:
        """Annotate this very execution (RESYNC_ANNOTATION), so that watchers see it again;
        whether it was still there to annotate."""
        return await self._patch_this(
            PLURAL, namespace, name, uid, {"annotations": {RESYNC_ANNOTATION: at}}
        )

    async def release_execution(self, namespace: str, name: str, *, uid: str) -> bool:
        """Take this very execution out of its tenant's queue (executions/queue.py); whether
        it was still there."""
        return await self._patch_this(
            PLURAL, namespace, name, uid, {"labels": {QUEUED_LABEL: None}}
        )

    async def _patch_this(
        self, plural: str, namespace: str, name: str, uid: str, metadata: Manifest
    ) -> bool:
        """Merge-patch the metadata of the object with this uid; whether it was patched. The
        uid in the patch is a precondition: a re-created namesake refuses it (422,
        metadata.uid is immutable) and is left alone, like a deleted one (404)."""
        body = {"metadata": {"uid": uid, **metadata}}
        try:
            await self._merge_patch_custom(plural, namespace, name, uid, body)
        except KubeError as error:
            namesake = error.status == 422 and "metadata.uid" in error.message
            if error.status != 404 and not namesake:
                raise
            return False
        return True

    async def delete_execution(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete this very execution (uid precondition: never a re-created namesake)."""
        options = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self._call(
                "delete",
                PLURAL,
                None,
                self._custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body=options,
            )
        except KubeError as error:
            if error.status not in (404, 409):
                raise

    # --- pools ----------------------------------------------------------------------------

    async def apply_configmap(self, body: Manifest) -> None:
        """Create the ConfigMap, or bring the data of the one of that name up to date."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            await self._call(
                "create",
                "configmaps",
                None,
                self._core.create_namespaced_config_map,
                namespace,
                body,
            )
            return
        except KubeError as error:
            if error.status != 409 or error.reason != "AlreadyExists":
                raise
        await self._call(
            "patch",
            "configmaps",
            None,
            self._core.patch_namespaced_config_map,
            name,
            namespace,
            {"data": body["data"]},
            _content_type=MERGE_PATCH,
        )

    async def list_pool_pods(self, namespace: str, pool_name: str) -> list[Manifest]:
        """Every pod labelled with the pool, free or claimed (a fresh, consistent read)."""
        selector = f"{POOL_LABEL}={pool_name}"
        return await self._list("pods", self._core.list_namespaced_pod, namespace, selector)

    async def create_pool_pod(self, body: Manifest) -> Manifest:
        namespace = body["metadata"]["namespace"]
        return await self._call(
            "create", "pods", None, self._core.create_namespaced_pod, namespace, body
        )

    async def delete_pool_pod(self, namespace: str, name: str, *, resource_version: str) -> bool:
        """Delete a free pod only as it was seen: False if it changed meanwhile (claimed) or
        is gone."""
        options = {"preconditions": {"resourceVersion": resource_version}, "gracePeriodSeconds": 0}
        try:
            await self._call(
                "delete",
                "pods",
                None,
                self._core.delete_namespaced_pod,
                name,
                namespace,
                body=options,
            )
        except KubeError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    async def patch_pool_status(self, namespace: str, name: str, status: Manifest) -> None:
        await self._call(
            "patch",
            f"{POOL_PLURAL}/status",
            None,
            self._custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            POOL_PLURAL,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
        )
