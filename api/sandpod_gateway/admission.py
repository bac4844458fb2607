"""Admission: whether a request may run, with which limits, and whether the tenant may start
another execution now."""

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from decimal import Decimal

from sandpod_contract.names import TENANT_LABEL
from sandpod_contract.quantities import parse_quantity, smaller_quantity

from sandpod_gateway.auth import Tenant
from sandpod_gateway.errors import ErrorDetail, GatewayError
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.resources import Resource, is_terminal
from sandpod_gateway.schemas import CreateExecutionRequest
from sandpod_gateway.service import ExecutionService
from sandpod_gateway.settings import GatewaySettings

MAX_RETRY_AFTER_SECONDS = 60


class AdmissionControl:
    """Serialises count-then-create per tenant, so one replica never overshoots a limit."""

    def __init__(self) -> None:
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    @asynccontextmanager
    async def admitting(self, tenant: str) -> AsyncIterator[None]:
        async with self._locks[tenant]:
            yield


def code_size(request: CreateExecutionRequest) -> int:
    """UTF-8 bytes of everything the execution carries as content."""
    size = len(request.code.encode())
    size += sum(len(f.content.encode()) + len(f.path) for f in request.files)
    size += len(request.stdin.encode()) if request.stdin is not None else 0
    size += sum(len(arg.encode()) for arg in request.args)
    return size


def _check_language(request: CreateExecutionRequest, catalog: LanguageCatalog) -> None:
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


def _check_size(request: CreateExecutionRequest, settings: GatewaySettings) -> None:
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


def _over_limit(field: str, limit: int | str) -> ErrorDetail:
    return ErrorDetail(
        field=f"body.{field}",
        message=f"at most {limit} for this tenant",
        type=f"max_{field}",
        limit=limit,
    )


def _check_tenant_limits(request: CreateExecutionRequest, tenant: Tenant) -> None:
    limits = tenant.limits
    violations: list[ErrorDetail] = []
    if request.timeout_seconds is not None and request.timeout_seconds > limits.max_timeout_seconds:
        violations.append(_over_limit("timeout_seconds", limits.max_timeout_seconds))
    if request.memory is not None and parse_quantity(request.memory) > parse_quantity(
        limits.max_memory
    ):
        violations.append(_over_limit("memory", limits.max_memory))
    if request.cpu is not None and parse_quantity(request.cpu) > parse_quantity(limits.max_cpu):
        violations.append(_over_limit("cpu", limits.max_cpu))
    if violations:
        names = ", ".join(str(v.type) for v in violations)
        raise GatewayError(
            422, "limit_exceeded", f"The request exceeds the tenant's limits: {names}", violations
        )


def check_request(
    request: CreateExecutionRequest,
    tenant: Tenant,
    catalog: LanguageCatalog,
    settings: GatewaySettings,
) -> None:
    """Refuse what cannot or may not run: unknown language (400), too much code (413),
    over the tenant's limits (422)."""
    _check_language(request, catalog)
    _check_size(request, settings)
    _check_tenant_limits(request, tenant)


def resolved_limits(
    request: CreateExecutionRequest, tenant: Tenant, settings: GatewaySettings
) -> tuple[int, str]:
    """(timeout in seconds, memory) of the execution: the request's, else the defaults
    within the tenant's maximums."""
    limits = tenant.limits
    timeout = request.timeout_seconds or min(
        settings.default_timeout_seconds, limits.max_timeout_seconds
    )
    memory = request.memory or smaller_quantity(settings.default_memory, limits.max_memory)
    return timeout, memory


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


async def check_concurrency(
    service: ExecutionService, tenant: Tenant, settings: GatewaySettings
) -> None:
    """429 with Retry-After when the tenant runs as many executions as it may."""
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
