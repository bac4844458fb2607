"""ExecutionService backed by the Kubernetes API (kubernetes_asyncio)."""

import asyncio
import base64
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException
from sandpod_contract.names import (
    CANCEL_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    SESSION_KIND,
    SESSION_PLURAL,
    VERSION,
)
from sandpod_contract.runner import FrameDecoder, OutputChunk

from sandpod_gateway.kube.resources import Resource, is_terminal
from sandpod_gateway.kube.service import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    ExecutionRejected,
    InvalidCursor,
    KubernetesUnavailable,
    PageData,
    QuotaExceeded,
    QuotaNotCounted,
    ResourceAlreadyExists,
    ResourceNotFound,
    SessionAlreadyExists,
    SessionNotFound,
)

logger = logging.getLogger(__name__)

TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)

Predicate = Callable[[Resource], bool]
Reader = Callable[[], Awaitable[Resource | None]]


def api_error_message(exc: ApiException) -> tuple[str, list[tuple[str | None, str]]]:
    """The message and field causes of the Status an API error carries."""
    try:
        status = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        status = None
    if not isinstance(status, dict):
        return str(exc.reason or exc), []
    details = status.get("details") or {}
    causes = [
        (cause.get("field"), str(cause.get("message", "")))
        for cause in details.get("causes") or []
        if isinstance(cause, dict)
    ]
    return str(status.get("message") or exc.reason or exc), causes


# The quota admission plugin's refusals (plugin/pkg/admission/resourcequota), 403 Forbidden:
# "exceeded quota: <name>, requested: …, used: …, limited: <resource>=<hard>,…" and
# "status unknown for quota: <name>, resources: …".
QUOTA_EXCEEDED = re.compile(r"exceeded quota: ([^,\s]+), .*limited: (\S+)")
QUOTA_NOT_COUNTED = re.compile(r"status unknown for quota: ([^,\s]+)")


def quota_refusal(exc: ApiException) -> QuotaExceeded | QuotaNotCounted | None:
    """What a ResourceQuota's refusal of a create says, or None for any other error."""
    if exc.status != 403:
        return None
    message = api_error_message(exc)[0]
    if exceeded := QUOTA_EXCEEDED.search(message):
        return QuotaExceeded(exceeded[1], exceeded[2])
    if not_counted := QUOTA_NOT_COUNTED.search(message):
        return QuotaNotCounted(not_counted[1])
    return None


def _unavailable(what: str, exc: Exception) -> KubernetesUnavailable:
    if isinstance(exc, ApiException):
        return KubernetesUnavailable(f"{what}: {exc.status} {api_error_message(exc)[0]}")
    return KubernetesUnavailable(f"{what}: {exc!r}")


def _pod_name(resource: Resource) -> str | None:
    name = (resource.get("status") or {}).get("podName")
    return name if isinstance(name, str) and name else None


@dataclass(frozen=True)
class LogFollow:
    """Where an execution's live output is: its pod's log, from `since_seconds` ago (None:
    from the start); only the frames of `execution_id`'s run (None: every frame)."""

    pod: str
    execution_id: str | None = None
    since_seconds: int | None = None


def log_follow(execution: Resource, now: datetime) -> LogFollow | None:
    """A pool pod serves many runs, one after another, and its log goes on after this one:
    follow it from a little before the run started, and only the run's own frames."""
    pod = _pod_name(execution)
    if pod is None:
        return None
    status = execution.get("status") or {}
    if status.get("startMode") != "warm":
        return LogFollow(pod)
    execution_id = str(execution["metadata"]["uid"])
    try:
        started = datetime.fromisoformat(str(status.get("startedAt")))
    except ValueError:
        return LogFollow(pod, execution_id)
    since = math.ceil((now - started).total_seconds()) + LOG_SINCE_SLACK_SECONDS
    return LogFollow(pod, execution_id, max(since, 1))


def _pod_started(pod: Resource) -> bool:
    """Whether the pod's log can be followed (its container runs or ran)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any(
        {"running", "terminated"} & set(container.get("state") or {})
        for container in status.get("containerStatuses") or []
    )


# A list answered with metadata only (no spec, no status): cheap to serve and to decode.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
DEFAULT_LOG_FOLLOW_BYTES = 8 * 1024 * 1024
# A pool pod's log is followed from this long before its run started (clocks of the
# operator and the node differ a little; lines of earlier runs are skipped anyway).
LOG_SINCE_SLACK_SECONDS = 30


@dataclass(frozen=True)
class _Watched:
    """One object to watch: the list call that watches its kind, that call's arguments (the
    namespace, and group, version and plural for a custom object) and the object's name."""

    list_function: Callable[..., Awaitable[Any]]
    list_args: tuple[str, ...]
    name: str


class CustomObjects:
    """Create, get, list and delete of one namespaced sandpod kind, with its own errors."""

    def __init__(
        self,
        api_client: ApiClient,
        plural: str,
        kind: str,
        not_found: type[ResourceNotFound],
        exists: type[ResourceAlreadyExists],
    ) -> None:
        self._custom = CustomObjectsApi(api_client)
        self.plural = plural
        self._kind = kind
        self._not_found = not_found
        self._exists = exists

    async def create(self, namespace: str, manifest: Resource) -> Resource:
        what = f"creating the {self._kind}"
        try:
            created: Resource = await self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, self.plural, manifest
            )
        except ApiException as exc:
            if exc.status == 409:
                raise self._exists(manifest["metadata"]["name"]) from exc
            if exc.status in (400, 422):
                raise ExecutionRejected(*api_error_message(exc)) from exc
            raise quota_refusal(exc) or _unavailable(what, exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise _unavailable(what, exc) from exc
        return created

    async def get(self, namespace: str, name: str) -> Resource:
        resource = await self.get_or_none(namespace, name)
        if resource is None:
            raise self._not_found(name)
        return resource

    async def get_or_none(self, namespace: str, name: str) -> Resource | None:
        try:
            resource: Resource = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, self.plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _unavailable(f"reading the {self._kind}", exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise _unavailable(f"reading the {self._kind}", exc) from exc
        return resource

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        what = f"listing {self._kind}s"
        options: dict[str, Any] = {"label_selector": label_selector}
        if limit is not None:
            options["limit"] = limit
        if cursor is not None:
            options["_continue"] = cursor
        try:
            result = await self._custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, self.plural, **options
            )
        except ApiException as exc:
            if cursor is not None and exc.status in (400, 410):
                raise InvalidCursor(cursor) from exc
            raise _unavailable(what, exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise _unavailable(what, exc) from exc
        next_cursor = (result.get("metadata") or {}).get("continue") or None
        return PageData(items=list(result.get("items") or []), next_cursor=next_cursor)

    async def delete(self, namespace: str, name: str) -> None:
        with self._errors_about(name, f"deleting the {self._kind}"):
            await self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, self.plural, name
            )

    async def annotate(
        self, namespace: str, name: str, annotations: dict[str, str], what: str = ""
    ) -> Resource:
        """Set these annotations (a merge patch); the not-found exception if it is gone."""
        patch = {"metadata": {"annotations": annotations}}
        with self._errors_about(name, what or f"annotating the {self._kind}"):
            patched: Resource = await self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                self.plural,
                name,
                patch,
                # Supported at runtime, missing from the type stubs.
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            )
        return patched

    @contextmanager
    def _errors_about(self, name: str, what: str) -> Iterator[None]:
        """A request about one object: its not-found exception for a 404, Kubernetes
        unavailable (saying `what` failed) for any other refusal or a transport error."""
        try:
            yield
        except ApiException as exc:
            if exc.status == 404:
                raise self._not_found(name) from exc
            raise _unavailable(what, exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise _unavailable(what, exc) from exc


class KubernetesSessionService(CustomObjects):
    def __init__(self, api_client: ApiClient) -> None:
        super().__init__(
            api_client, SESSION_PLURAL, SESSION_KIND, SessionNotFound, SessionAlreadyExists
        )


class KubernetesExecutionService:
    def __init__(
        self, api_client: ApiClient, log_follow_limit_bytes: int = DEFAULT_LOG_FOLLOW_BYTES
    ) -> None:
        self._api_client = api_client
        self._log_follow_limit_bytes = log_follow_limit_bytes
        self._objects = CustomObjects(
            api_client, PLURAL, KIND, ExecutionNotFound, ExecutionAlreadyExists
        )
        self._custom = CustomObjectsApi(api_client)
        self._core = CoreV1Api(api_client)

    async def create(self, namespace: str, manifest: Resource) -> Resource:
        return await self._objects.create(namespace, manifest)

    async def get(self, namespace: str, name: str) -> Resource:
        return await self._objects.get(namespace, name)

    async def list_metadata(
        self, namespace: str, *, label_selector: str, limit: int
    ) -> list[Resource]:
        # The generated client fixes Accept to JSON, so the request is made one level down.
        try:
            result = await self._api_client.call_api(
                f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}",
                "GET",
                path_params={"namespace": namespace},
                query_params=[("labelSelector", label_selector), ("limit", limit)],
                header_params={"Accept": METADATA_ONLY},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise _unavailable("listing CodeExecutions", exc) from exc
        if not isinstance(result, dict):
            raise KubernetesUnavailable("listing CodeExecutions: not a list")
        return [item for item in result.get("items") or [] if isinstance(item, dict)]

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        return await self._objects.list(
            namespace, label_selector=label_selector, limit=limit, cursor=cursor
        )

    async def cancel(self, namespace: str, name: str) -> Resource:
        return await self._objects.annotate(
            namespace, name, {CANCEL_ANNOTATION: "true"}, "cancelling the CodeExecution"
        )

    async def wait(self, namespace: str, name: str, timeout: float) -> Resource:
        deadline = asyncio.get_running_loop().time() + timeout
        return await self._watch_execution_until(namespace, name, is_terminal, deadline)

    async def stream(self, namespace: str, name: str, timeout: float) -> AsyncIterator[OutputChunk]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        execution = await self._watch_execution_until(
            namespace, name, lambda r: is_terminal(r) or _pod_name(r) is not None, deadline
        )
        follow = log_follow(execution, datetime.now(UTC))
        if follow is None:
            return
        response = await self._follow_pod_log(
            namespace, follow.pod, deadline, since_seconds=follow.since_seconds
        )
        if response is None:
            return
        decoder = FrameDecoder(follow.execution_id)
        try:
            while not decoder.ended and (remaining := deadline - loop.time()) > 0:
                try:
                    data = await asyncio.wait_for(response.content.readany(), remaining)
                except TimeoutError:
                    return
                except (aiohttp.ClientError, OSError) as exc:
                    raise _unavailable("reading the pod log", exc) from exc
                if not data:
                    for chunk in decoder.finish():
                        yield chunk
                    return
                for chunk in decoder.feed(data):
                    yield chunk
        finally:
            response.close()

    async def read_outputs(self, namespace: str, configmap: str) -> dict[str, bytes]:
        try:
            found = await self._core.read_namespaced_config_map(configmap, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise _unavailable("reading the output files", exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise _unavailable("reading the output files", exc) from exc
        return {key: base64.b64decode(value) for key, value in (found.binary_data or {}).items()}

    async def check_ready(self) -> None:
        try:
            resources = await self._custom.get_api_resources(GROUP, VERSION)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise _unavailable(f"discovering {GROUP}/{VERSION}", exc) from exc
        if not any(resource.name == PLURAL for resource in resources.resources or []):
            raise KubernetesUnavailable(f"the API server does not serve {PLURAL}.{GROUP}")

    async def _read_pod_or_none(self, namespace: str, pod: str) -> Resource | None:
        try:
            body = await self._core.read_namespaced_pod(pod, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _unavailable("reading the pod", exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise _unavailable("reading the pod", exc) from exc
        resource: Resource = self._api_client.sanitize_for_serialization(body)
        return resource

    async def _follow_pod_log(
        self, namespace: str, pod: str, deadline: float, *, since_seconds: int | None = None
    ) -> aiohttp.ClientResponse | None:
        """The followed log of the pod once its container has started; None if it is gone."""
        started = False
        while True:
            try:
                # Without preloading, the client hands back the open HTTP response, and
                # leaves its status to the caller.
                response = cast(
                    aiohttp.ClientResponse,
                    await self._core.read_namespaced_pod_log(
                        pod,
                        namespace,
                        follow=True,
                        limit_bytes=self._log_follow_limit_bytes,
                        since_seconds=since_seconds,  # type: ignore[arg-type]  # None: omitted
                        _preload_content=False,
                    ),
                )
            except TRANSPORT_ERRORS as exc:
                raise _unavailable("following the pod log", exc) from exc
            if response.status == 200:
                return response
            try:
                message = await response.text()
            finally:
                response.close()
            if response.status == 404:
                return None
            # 400 (no container running yet) and 204 (no node yet) mean: not started.
            if response.status not in (204, 400) or started:
                raise KubernetesUnavailable(
                    f"following the pod log: {response.status} {message[:500]}"
                )
            latest = await self._watch_until(
                _Watched(self._core.list_namespaced_pod, (namespace,), pod),
                lambda: self._read_pod_or_none(namespace, pod),
                _pod_started,
                deadline,
            )
            if latest is None or not _pod_started(latest):
                return None
            started = True

    async def _watch_execution_until(
        self, namespace: str, name: str, done: Predicate, deadline: float
    ) -> Resource:
        resource = await self._watch_until(
            _Watched(
                self._custom.list_namespaced_custom_object,
                (GROUP, VERSION, namespace, PLURAL),
                name,
            ),
            lambda: self._objects.get_or_none(namespace, name),
            done,
            deadline,
        )
        if resource is None:
            raise ExecutionNotFound(name)
        return resource

    async def _watch_until(
        self,
        watched: _Watched,
        read: Reader,
        done: Predicate,
        deadline: float,
    ) -> Resource | None:
        """Watch one object until ``done`` holds or the deadline passes.

        Returns its last known state, or None once it is deleted. Every watch starts
        at the resourceVersion of a fresh read, and a read follows every watch that
        ends without an answer, so no change is missed.
        """
        loop = asyncio.get_running_loop()
        resource = await read()
        while resource is not None and not done(resource):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return resource
            try:
                async with asyncio.timeout(remaining):
                    latest = await self._watch_once(watched, resource, done, math.ceil(remaining))
            except TimeoutError:
                return resource
            if latest is None or done(latest):
                return latest
            resource = await read()
        return resource

    async def _watch_once(
        self,
        watched: _Watched,
        resource: Resource,
        done: Predicate,
        timeout_seconds: int,
    ) -> Resource | None:
        """One watch from ``resource``'s version: the state that satisfied ``done``, the
        last state seen when the watch ended, or None if the object was deleted."""
        latest = resource
        try:
            async with watch.Watch() as stream:
                async for event in stream.stream(
                    watched.list_function,
                    *watched.list_args,
                    field_selector=f"metadata.name={watched.name}",
                    resource_version=resource["metadata"]["resourceVersion"],
                    timeout_seconds=timeout_seconds,
                ):
                    if event["type"] == "DELETED":
                        return None
                    if event["type"] in ("ADDED", "MODIFIED"):
                        changed: Resource = event["raw_object"]
                        if done(changed):
                            return changed
                        latest = changed
        except ApiException as exc:
            if exc.status != 410:  # 410: the version is too old; the caller reads afresh
                raise _unavailable(f"watching {watched.name}", exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise _unavailable(f"watching {watched.name}", exc) from exc
        return latest
