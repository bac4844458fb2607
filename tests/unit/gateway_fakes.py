"""In-memory stand-ins for the gateway's Kubernetes side, for HTTP-layer unit tests
(installed through app.dependency_overrides). The fake service plays the operator:
``runner`` decides how each execution ends and what it prints."""

import copy
import itertools
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from fastapi import FastAPI
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sandpod_contract.models import TERMINAL_PHASES
from sandpod_contract.names import CANCEL_ANNOTATION, FINISHED_LABEL
from sandpod_contract.runner import OutputChunk
from sandpod_gateway.kube.kube_service import KubernetesExecutionService, KubernetesSessionService
from sandpod_gateway.kube.service import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    InvalidCursor,
    KubernetesUnavailable,
    PageData,
    SessionAlreadyExists,
    SessionNotFound,
)
from sandpod_gateway.main import create_app
from sandpod_gateway.policy.auth import Tenant, TenantLimits
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.web.dependencies import (
    get_execution_service,
    get_key_store,
    get_session_service,
)
from sandpod_gateway.web.pad import PAD_DIR
from sandpod_testkit.processes import free_port, http_ok
from sandpod_testkit.sse import iter_sse
from sandpod_testkit.waiting import wait_until

Resource = dict[str, Any]


@dataclass
class Run:
    """How a fake execution ends: its final status and the output chunks it streams."""

    status: dict[str, Any]
    chunks: list[OutputChunk] = field(default_factory=list)
    # The stored output files (status.outputsConfigMap's binaryData, decoded), by key.
    files: dict[str, bytes] = field(default_factory=dict)


def echo_runner(spec: Resource) -> Run:
    """Succeeds, printing its source back; sources starting with "fail" exit 1."""
    source = spec["source"]
    if source.startswith("fail"):
        return Run(
            {"phase": "Failed", "exitCode": 1, "stdout": "", "stderr": "boom\n", "durationMs": 7},
            [OutputChunk("stderr", "boom\n")],
        )
    return Run(
        {"phase": "Succeeded", "exitCode": 0, "stdout": source, "stderr": "", "durationMs": 5},
        [OutputChunk("stdout", source)],
    )


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Equality (k=v) and absence (!k) terms, comma-separated, as the API server reads them."""
    for term in selector.split(","):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
            continue
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def selected(
    objects: dict[tuple[str, str], Resource], namespace: str, label_selector: str
) -> list[Resource]:
    """Copies of the namespace's objects the selector selects, by name."""
    return [
        copy.deepcopy(resource)
        for (ns, _), resource in sorted(objects.items())
        if ns == namespace and selects(label_selector, resource["metadata"].get("labels", {}))
    ]


def page_of(items: list[Resource], limit: int | None, cursor: str | None) -> PageData:
    """One page as the API server cuts it; the fake's cursor is the next item's index."""
    if cursor is not None and not (cursor.isascii() and cursor.isdigit()):
        raise InvalidCursor(cursor)
    start = int(cursor or 0)
    end = len(items) if limit is None else start + limit
    return PageData(items=items[start:end], next_cursor=str(end) if end < len(items) else None)


def created_from(manifest: Resource, namespace: str) -> Resource:
    """A copy of the manifest as the API server stores it."""
    resource = copy.deepcopy(manifest)
    resource["metadata"]["namespace"] = namespace
    resource["metadata"]["creationTimestamp"] = datetime.now(UTC).isoformat()
    return resource


def mark_finished(resource: Resource) -> None:
    """What the operator does once it has written a terminal status."""
    resource["metadata"].setdefault("labels", {})[FINISHED_LABEL] = "true"


class FakeExecutionService:
    def __init__(self, runner: Callable[[Resource], Run] | None = echo_runner) -> None:
        """runner None: executions never finish by themselves (they stay Pending)."""
        self.runner = runner
        self.objects: dict[tuple[str, str], Resource] = {}
        self.created: list[Resource] = []
        self.pod_gone: set[str] = set()
        self.ready = True
        self.metadata_lists = 0
        self.configmaps: dict[tuple[str, str], dict[str, bytes]] = {}
        self.configmap_reads = 0
        self._versions = itertools.count(1)

    def _store(self, namespace: str, resource: Resource) -> Resource:
        resource["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[(namespace, resource["metadata"]["name"])] = resource
        return copy.deepcopy(resource)

    def finish(self, namespace: str, name: str) -> None:
        """Run the execution to its end, as the operator would."""
        resource = self.objects[(namespace, name)]
        if resource.get("status", {}).get("phase") in TERMINAL_PHASES or self.runner is None:
            return
        run = self.runner(resource["spec"])
        resource["status"] = run.status
        if run.files:
            self.configmaps[(namespace, run.status["outputsConfigMap"])] = run.files
        mark_finished(resource)
        self._store(namespace, resource)

    async def create(self, namespace: str, manifest: Resource) -> Resource:
        name = manifest["metadata"]["name"]
        if (namespace, name) in self.objects:
            raise ExecutionAlreadyExists(name)
        resource = created_from(manifest, namespace)
        self.created.append(copy.deepcopy(resource))
        return self._store(namespace, resource)

    async def get(self, namespace: str, name: str) -> Resource:
        try:
            return copy.deepcopy(self.objects[(namespace, name)])
        except KeyError:
            raise ExecutionNotFound(name) from None

    def _selected(self, namespace: str, label_selector: str) -> list[Resource]:
        return selected(self.objects, namespace, label_selector)

    async def list_metadata(
        self, namespace: str, *, label_selector: str, limit: int
    ) -> list[Resource]:
        self.metadata_lists += 1
        return [
            {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": resource["metadata"],
            }
            for resource in self._selected(namespace, label_selector)[:limit]
        ]

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        return page_of(self._selected(namespace, label_selector), limit, cursor)

    async def cancel(self, namespace: str, name: str) -> Resource:
        resource = self.objects.get((namespace, name))
        if resource is None:
            raise ExecutionNotFound(name)
        resource["metadata"].setdefault("annotations", {})[CANCEL_ANNOTATION] = "true"
        patched = self._store(namespace, resource)
        resource["status"] = {"phase": "Cancelled", "reason": "Cancelled"}
        mark_finished(resource)
        self._store(namespace, resource)
        return patched

    async def wait(self, namespace: str, name: str, timeout: float) -> Resource:
        self.finish(namespace, name)
        return await self.get(namespace, name)

    async def stream(self, namespace: str, name: str, timeout: float) -> AsyncIterator[OutputChunk]:
        resource = await self.get(namespace, name)
        if name in self.pod_gone or self.runner is None:
            return
        for chunk in self.runner(resource["spec"]).chunks:
            yield chunk
        self.finish(namespace, name)

    async def read_outputs(self, namespace: str, configmap: str) -> dict[str, bytes]:
        self.configmap_reads += 1
        return dict(self.configmaps.get((namespace, configmap), {}))

    async def check_ready(self) -> None:
        if not self.ready:
            raise KubernetesUnavailable("fake cluster is down")


class FakeSessionService:
    """CodeSessions in memory; `phase` is the phase a new session gets (the operator's)."""

    def __init__(self, phase: str = "Ready") -> None:
        self.phase = phase
        self.objects: dict[tuple[str, str], Resource] = {}
        self.deleted: list[tuple[str, str]] = []
        self.reads = 0

    async def create(self, namespace: str, manifest: Resource) -> Resource:
        name = manifest["metadata"]["name"]
        if (namespace, name) in self.objects:
            raise SessionAlreadyExists(name)
        resource = created_from(manifest, namespace)
        resource["metadata"]["uid"] = str(uuid.uuid4())
        resource["status"] = {"phase": self.phase, "executionCount": 0}
        self.objects[(namespace, name)] = resource
        return copy.deepcopy(resource)

    async def get(self, namespace: str, name: str) -> Resource:
        self.reads += 1
        try:
            return copy.deepcopy(self.objects[(namespace, name)])
        except KeyError:
            raise SessionNotFound(name) from None

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        return page_of(selected(self.objects, namespace, label_selector), limit, cursor)

    async def delete(self, namespace: str, name: str) -> None:
        if self.objects.pop((namespace, name), None) is None:
            raise SessionNotFound(name)
        self.deleted.append((namespace, name))

    async def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> Resource:
        resource = await self.get(namespace, name)
        stored = self.objects[(namespace, name)]
        stored["metadata"].setdefault("annotations", {}).update(annotations)
        return {**resource, "metadata": copy.deepcopy(stored["metadata"])}

    def end(self, namespace: str, name: str, reason: str = "IdleTimeout") -> None:
        self.objects[(namespace, name)]["status"] = {"phase": "Ended", "reason": reason}


class FakeKeyStore:
    def __init__(self, keys: dict[str, Tenant]) -> None:
        self.keys = keys

    async def authenticate(self, key: str) -> Tenant | None:
        return self.keys.get(key)

    async def tenant(self, name: str) -> Tenant | None:
        return next((t for t in self.keys.values() if t.name == name), None)

    async def check_ready(self) -> None:
        return None


def tenant(name: str, namespace: str | None = None, **limits: Any) -> Tenant:
    return Tenant(name=name, namespace=namespace or f"ns-{name}", limits=TenantLimits(**limits))


UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def make_app(
    service: FakeExecutionService,
    keys: dict[str, Tenant],
    kubeconfig_dir: Path | None = None,
    sessions: FakeSessionService | None = None,
    pad_dir: Path = PAD_DIR,
    **settings: Any,
) -> FastAPI:
    """The real app with the fakes behind its dependencies. For tests that run its
    lifespan (needed by /mcp), pass kubeconfig_dir: the lifespan then opens a client for
    a cluster that is never contacted."""
    if kubeconfig_dir is not None:
        kubeconfig = kubeconfig_dir / "kubeconfig"
        kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
        settings["kubeconfig"] = kubeconfig
    app = create_app(GatewaySettings(**settings), pad_dir=pad_dir)
    app.dependency_overrides[get_execution_service] = lambda: service
    app.dependency_overrides[get_key_store] = lambda: FakeKeyStore(keys)
    session_service = sessions or FakeSessionService()
    app.dependency_overrides[get_session_service] = lambda: session_service
    return app


@asynccontextmanager
async def http_client(app: FastAPI, key: str | None) -> AsyncIterator[httpx2.AsyncClient]:
    """A client of the running app (its lifespan entered and left in the test's own task),
    for /mcp."""
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://gateway",
            headers={"Authorization": f"Bearer {key}"} if key else {},
        ) as client,
    ):
        yield client


@asynccontextmanager
async def mcp_client(app: FastAPI, key: str | None) -> AsyncIterator[Client]:
    """An MCP client of the running app's /mcp, presenting ``key``."""
    async with (
        http_client(app, key) as http,
        Client(streamable_http_client("http://gateway/mcp", http_client=http)) as client,
    ):
        yield client


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a port of its own, for clients that speak real
    HTTP (a browser, an official SDK): its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/healthz"), timeout=30, what="the gateway's /healthz")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """(event, decoded JSON data) of each event in a text/event-stream body."""
    return list(iter_sse([*text.replace("\r\n", "\n").split("\n"), ""]))


class RefusingCustomObjects:
    """Stands in for CustomObjectsApi: every create is refused with `status` (the body the
    API server sends)."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    async def create_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        error = ApiException(status=self.status["code"], reason=self.status["reason"])
        error.body = json.dumps(self.status)
        raise error


def refusing_services(
    api_client: ApiClient, status: dict[str, Any]
) -> tuple[KubernetesExecutionService, KubernetesSessionService]:
    """The real execution and session services over an API that refuses every create."""
    executions = KubernetesExecutionService(api_client)
    sessions = KubernetesSessionService(api_client)
    executions._objects._custom = RefusingCustomObjects(status)  # type: ignore[assignment]
    sessions._custom = RefusingCustomObjects(status)  # type: ignore[assignment]
    return executions, sessions
