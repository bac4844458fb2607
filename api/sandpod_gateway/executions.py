"""What the gateway does with executions: admission, idempotency, waiting, streaming.

Routers and the MCP tool both call these; they talk to Kubernetes only through
an ExecutionService.
"""

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from fastapi.sse import ServerSentEvent
from sandpod_contract.names import REQUEST_HASH_ANNOTATION, TENANT_LABEL
from sandpod_contract.quantities import parse_quantity, smaller_quantity

from sandpod_gateway.auth import Tenant
from sandpod_gateway.errors import ErrorDetail, GatewayError
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.resources import (
    Resource,
    belongs_to,
    build_code_execution,
    code_size,
    execution_name,
    execution_result,
    is_execution_name,
    is_terminal,
    request_fingerprint,
)
from sandpod_gateway.schemas import CreateExecutionRequest, ExecutionResult, OutputEvent
from sandpod_gateway.service import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    ExecutionRejected,
    ExecutionService,
    KubernetesUnavailable,
)
from sandpod_gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

MAX_RETRY_AFTER_SECONDS = 60


class AdmissionControl:
    """Serialises count-then-create per tenant, so one replica never overshoots a limit."""

    def __init__(self) -> None:
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    @asynccontextmanager
    async def admitting(self, tenant: str) -> AsyncIterator[None]:
        async with self._locks[tenant]:
            yield


@dataclass(frozen=True)
class CreateOutcome:
    result: ExecutionResult
    created: bool


def not_found(execution_id: str) -> GatewayError:
    return GatewayError(404, "not_found", f"No execution {execution_id!r}")


def unavailable(exc: KubernetesUnavailable, settings: GatewaySettings) -> GatewayError:
    logger.warning("Kubernetes unavailable: %s", exc)
    return GatewayError(
        503,
        "kubernetes_unavailable",
        "The cluster could not be reached; retry later.",
        headers={"Retry-After": str(settings.default_retry_after_seconds)},
    )


def check_request(
    request: CreateExecutionRequest,
    tenant: Tenant,
    catalog: LanguageCatalog,
    settings: GatewaySettings,
) -> None:
    """Refuse what cannot or may not run: unknown language (400), too much code (413),
    over the tenant's limits (422)."""
    language = catalog.get(request.language)
    if language is None:
        known = ", ".join(catalog.names())
        raise GatewayError(
            400,
            "unknown_language",
            f"Unknown language {request.language!r}; known languages: {known}",
            [
                ErrorDetail(
                    field="body.language", message=f"one of: {known}", type="unknown_language"
                )
            ],
        )
    if request.mode == "lint" and not language.lint:
        raise GatewayError(
            400,
            "lint_not_supported",
            f"mode=lint is not available for {request.language}",
            [ErrorDetail(field="body.mode", message="lint is not available", type="lint")],
        )
    size = code_size(request)
    if size > settings.max_code_bytes:
        raise GatewayError(
            413,
            "code_too_large",
            f"The code, files, stdin and args add up to {size} bytes; "
            f"the limit is {settings.max_code_bytes}.",
            [
                ErrorDetail(
                    field="body.code",
                    message="too large",
                    type="max_code_bytes",
                    limit=settings.max_code_bytes,
                )
            ],
        )
    limits = tenant.limits
    violations: list[ErrorDetail] = []
    if request.timeout_seconds is not None and request.timeout_seconds > limits.max_timeout_seconds:
        violations.append(
            ErrorDetail(
                field="body.timeout_seconds",
                message=f"at most {limits.max_timeout_seconds} for this tenant",
                type="max_timeout_seconds",
                limit=limits.max_timeout_seconds,
            )
        )
    if request.memory is not None and parse_quantity(request.memory) > parse_quantity(
        limits.max_memory
    ):
        violations.append(
            ErrorDetail(
                field="body.memory",
                message=f"at most {limits.max_memory} for this tenant",
                type="max_memory",
                limit=limits.max_memory,
            )
        )
    if request.cpu is not None and parse_quantity(request.cpu) > parse_quantity(limits.max_cpu):
        violations.append(
            ErrorDetail(
                field="body.cpu",
                message=f"at most {limits.max_cpu} for this tenant",
                type="max_cpu",
                limit=limits.max_cpu,
            )
        )
    if violations:
        names = ", ".join(str(v.type) for v in violations)
        raise GatewayError(
            422, "limit_exceeded", f"The request exceeds the tenant's limits: {names}", violations
        )


def retry_after_seconds(active: list[Resource], now: datetime, default: int) -> int:
    """Seconds until the first running execution must have ended (its timeout), 1..60."""
    remaining: list[Decimal] = []
    for resource in active:
        started = (resource.get("status") or {}).get("startedAt")
        timeout = (resource.get("spec") or {}).get("timeoutSeconds")
        if not isinstance(started, str) or not isinstance(timeout, int):
            continue
        try:
            started_at = datetime.fromisoformat(started)
        except ValueError:
            continue
        remaining.append(Decimal(timeout) - Decimal(str((now - started_at).total_seconds())))
    if not remaining:
        return default
    soonest = int(min(remaining).to_integral_value("ROUND_CEILING"))
    return max(1, min(MAX_RETRY_AFTER_SECONDS, soonest))


def _wait_timeout(resource: Resource, settings: GatewaySettings) -> float:
    timeout = (resource.get("spec") or {}).get("timeoutSeconds")
    seconds = timeout if isinstance(timeout, int) else settings.default_timeout_seconds
    return seconds + settings.wait_margin_seconds


async def _replay(
    service: ExecutionService, tenant: Tenant, name: str, fingerprint: str
) -> Resource | None:
    """The execution an earlier request with this Idempotency-Key created, if any."""
    try:
        resource = await service.get(tenant.namespace, name)
    except ExecutionNotFound:
        return None
    annotations = (resource.get("metadata") or {}).get("annotations") or {}
    same_request = annotations.get(REQUEST_HASH_ANNOTATION) == fingerprint
    if not belongs_to(resource, tenant.name) or not same_request:
        raise GatewayError(
            409,
            "idempotency_key_reused",
            "This Idempotency-Key was already used for a different request.",
            [ErrorDetail(field="header.idempotency-key", message="reused", type="idempotency_key")],
        )
    return resource


async def _check_concurrency(
    service: ExecutionService, tenant: Tenant, settings: GatewaySettings
) -> None:
    page = await service.list(
        tenant.namespace, label_selector=f"{TENANT_LABEL}={tenant.name}", limit=None, cursor=None
    )
    active = [resource for resource in page.items if not is_terminal(resource)]
    limit = tenant.limits.max_concurrent
    if len(active) >= limit:
        retry_after = retry_after_seconds(
            active, datetime.now(UTC), settings.default_retry_after_seconds
        )
        raise GatewayError(
            429,
            "concurrency_limit",
            f"{len(active)} executions are already running; this tenant may run {limit} at once.",
            [ErrorDetail(message="too many running", type="max_concurrent", limit=limit)],
            headers={"Retry-After": str(retry_after)},
        )


async def create_execution(
    request: CreateExecutionRequest,
    *,
    tenant: Tenant,
    service: ExecutionService,
    catalog: LanguageCatalog,
    settings: GatewaySettings,
    admission: AdmissionControl,
    idempotency_key: str | None,
    wait: bool,
) -> CreateOutcome:
    check_request(request, tenant, catalog, settings)
    name = execution_name(tenant.name, idempotency_key)
    fingerprint = request_fingerprint(request)
    try:
        resource = None
        created = False
        if idempotency_key is not None:
            resource = await _replay(service, tenant, name, fingerprint)
        if resource is None:
            resource, created = await _admit(
                request, name, tenant, service, settings, admission, fingerprint
            )
        if wait and not is_terminal(resource):
            resource = await service.wait(tenant.namespace, name, _wait_timeout(resource, settings))
    except ExecutionNotFound as exc:
        raise GatewayError(
            409, "execution_deleted", f"Execution {name!r} was deleted while in use"
        ) from exc
    except KubernetesUnavailable as exc:
        raise unavailable(exc, settings) from exc
    return CreateOutcome(execution_result(resource), created)


async def _admit(
    request: CreateExecutionRequest,
    name: str,
    tenant: Tenant,
    service: ExecutionService,
    settings: GatewaySettings,
    admission: AdmissionControl,
    fingerprint: str,
) -> tuple[Resource, bool]:
    """Create the execution if the tenant may run another: (the execution, created?)."""
    limits = tenant.limits
    manifest = build_code_execution(
        name=name,
        tenant=tenant.name,
        request=request,
        timeout_seconds=request.timeout_seconds
        or min(settings.default_timeout_seconds, limits.max_timeout_seconds),
        memory=request.memory or smaller_quantity(settings.default_memory, limits.max_memory),
        ttl_seconds_after_finished=settings.ttl_seconds_after_finished,
    )
    async with admission.admitting(tenant.name):
        await _check_concurrency(service, tenant, settings)
        try:
            return await service.create(tenant.namespace, manifest), True
        except ExecutionAlreadyExists:
            existing = await _replay(service, tenant, name, fingerprint)
            if existing is None:
                raise GatewayError(
                    409, "conflict", f"Execution {name!r} is being replaced; retry"
                ) from None
            return existing, False
        except ExecutionRejected as exc:
            raise GatewayError(
                422,
                "invalid_execution",
                f"The cluster refused the execution: {exc.message}",
                [ErrorDetail(field=field, message=message) for field, message in exc.causes],
            ) from exc


async def get_owned_execution(
    execution_id: str, tenant: Tenant, service: ExecutionService, settings: GatewaySettings
) -> Resource:
    """The tenant's execution; 404 for anything else, another tenant's included."""
    if not is_execution_name(execution_id):
        raise not_found(execution_id)
    try:
        resource = await service.get(tenant.namespace, execution_id)
    except ExecutionNotFound as exc:
        raise not_found(execution_id) from exc
    except KubernetesUnavailable as exc:
        raise unavailable(exc, settings) from exc
    if not belongs_to(resource, tenant.name):
        raise not_found(execution_id)
    return resource


def _replayed_output(result: ExecutionResult) -> Iterator[ServerSentEvent]:
    if result.stdout:
        yield ServerSentEvent(event="stdout", data=OutputEvent(data=result.stdout))
    if result.stderr:
        yield ServerSentEvent(event="stderr", data=OutputEvent(data=result.stderr))


async def execution_events(
    resource: Resource, namespace: str, service: ExecutionService, settings: GatewaySettings
) -> AsyncIterator[ServerSentEvent]:
    """SSE events of one execution: stdout/stderr chunks live from the pod log, then exit
    with the result. If the pod is gone already, the output kept in the status is replayed."""
    name = resource["metadata"]["name"]
    timeout = _wait_timeout(resource, settings)
    streamed = False
    try:
        async for chunk in service.stream(namespace, name, timeout):
            streamed = True
            yield ServerSentEvent(event=chunk.stream, data=OutputEvent(data=chunk.data))
        if not is_terminal(resource):
            resource = await service.wait(namespace, name, timeout)
    except (KubernetesUnavailable, ExecutionNotFound) as exc:
        logger.warning("stream of %s/%s ended early: %s", namespace, name, exc)
        code = "not_found" if isinstance(exc, ExecutionNotFound) else "kubernetes_unavailable"
        yield ServerSentEvent(event="error", data={"code": code, "message": str(exc)})
        return
    result = execution_result(resource)
    if not streamed:
        for event in _replayed_output(result):
            yield event
    yield ServerSentEvent(event="exit", data=result)
