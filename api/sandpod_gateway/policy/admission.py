"""Admission: whether a request may run, with which limits, and whether the tenant may start
another execution now."""

import asyncio
import math
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TypeVar

from sandpod_contract.models import (
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_MAX_LIFETIME_SECONDS,
    CodeSessionSpec,
    Resources,
)
from sandpod_contract.names import FINISHED_LABEL, TENANT_LABEL
from sandpod_contract.quantities import parse_quantity, smaller_quantity

from sandpod_gateway.kube.resources import Resource, created_at, is_ended
from sandpod_gateway.kube.service import ExecutionService, SessionService
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.policy.auth import Tenant, TenantLimits
from sandpod_gateway.schemas import CreateExecutionRequest, CreateSessionRequest, LanguageInfo
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.web.errors import ErrorDetail, GatewayError

MAX_RETRY_AFTER_SECONDS = 60

Key = TypeVar("Key", bound=Hashable)


@dataclass
class TokenBucket:
    """A token bucket: `tokens` as of `updated` (seconds on a monotonic clock)."""

    tokens: float
    updated: float

    def take(self, now: float, rate: float, burst: float) -> float:
        """Take one token, refilled at `rate` per second up to `burst`: 0 if one was taken,
        else the seconds until one will be there."""
        self.tokens = min(burst, self.tokens + max(0.0, now - self.updated) * rate)
        self.updated = max(self.updated, now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / rate


@dataclass(frozen=True)
class RateShare:
    """This replica's share of a tenant's request rate and burst (each replica admits its
    share, so the replicas together admit the tenant's limits)."""

    rate: float
    burst: float

    @classmethod
    def of(cls, limits: TenantLimits, replicas: int) -> "RateShare":
        # At least one token, or a tenant with a burst below the replica count gets nothing.
        return cls(
            rate=limits.requests_per_second / replicas,
            burst=max(1.0, limits.request_burst / replicas),
        )


def rate_limited(limits: TenantLimits, wait_seconds: float) -> GatewayError:
    retry_after = max(1, math.ceil(wait_seconds))
    rate, burst = limits.requests_per_second, limits.request_burst
    return GatewayError(
        429,
        "rate_limited",
        f"This tenant may make {rate} requests per second (bursts of up to {burst}); "
        f"retry in {retry_after} s.",
        [ErrorDetail(message="too many requests", type="requests_per_second", limit=rate)],
        retry_after=retry_after,
    )


class AdmissionControl:
    """Per-process admission state: each tenant's request rate (its share of it, with
    `replicas` gateway replicas), serialises count-then-create per tenant (one replica never
    overshoots a limit), and counts the open waits and streams of each tenant and execution."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._waits: Counter[str] = Counter()
        self._waits_on: Counter[tuple[str, str]] = Counter()
        self._follows = 0

    def count_request(self, tenant: Tenant, replicas: int) -> None:
        """Count one request of `tenant`; 429 ``rate_limited`` with Retry-After when it is
        beyond the tenant's rate and burst."""
        share = RateShare.of(tenant.limits, replicas)
        now = self._clock()
        bucket = self._buckets.setdefault(tenant.name, TokenBucket(share.burst, now))
        wait = bucket.take(now, share.rate, share.burst)
        if wait > 0:
            raise rate_limited(tenant.limits, wait)

    @asynccontextmanager
    async def admitting(self, tenant: str) -> AsyncIterator[None]:
        async with self._locks[tenant]:
            yield

    def open_waits(self, tenant: str) -> int:
        return self._waits[tenant]

    @contextmanager
    def waiting(
        self, tenant: Tenant, execution: str, settings: GatewaySettings, *, follows_log: bool
    ) -> Iterator[None]:
        """Hold one of the tenant's wait slots (a waiting create or a stream) on `execution`
        for the block; 429 ``too_many_waits`` when the tenant, the execution or (for a log
        follow) the whole gateway has none left."""
        key = (tenant.name, execution)
        limits = tenant.limits
        if self._waits[tenant.name] >= limits.max_open_waits:
            raise _too_many_waits("max_open_waits", limits.max_open_waits, settings)
        if self._waits_on[key] >= limits.max_waits_per_execution:
            raise _too_many_waits(
                "max_waits_per_execution", limits.max_waits_per_execution, settings
            )
        if follows_log and self._follows >= settings.max_log_follows:
            raise _too_many_waits("max_log_follows", settings.max_log_follows, settings)
        self._waits[tenant.name] += 1
        self._waits_on[key] += 1
        self._follows += follows_log
        try:
            yield
        finally:
            self._follows -= follows_log
            _release(self._waits, tenant.name)
            _release(self._waits_on, key)


def _release(counter: Counter[Key], key: Key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


WAIT_LIMIT_MESSAGES = {
    "max_open_waits": "This tenant has {limit} requests waiting or streaming already",
    "max_waits_per_execution": "{limit} requests are waiting on or streaming this execution "
    "already (the same Idempotency-Key included)",
    "max_log_follows": "The gateway follows {limit} logs already",
}


def _too_many_waits(kind: str, limit: int, settings: GatewaySettings) -> GatewayError:
    message = WAIT_LIMIT_MESSAGES[kind].format(limit=limit)
    return GatewayError(
        429,
        "too_many_waits",
        f"{message}; retry later, or ask with wait=false and read the result later.",
        [ErrorDetail(message="too many open waits", type=kind, limit=limit)],
        retry_after=settings.default_retry_after_seconds,
    )


def code_size(request: CreateExecutionRequest) -> int:
    """UTF-8 bytes of everything the execution carries as content."""
    size = len(request.code.encode())
    size += sum(
        len((f.content or f.content_base64 or "").encode()) + len(f.path) for f in request.files
    )
    size += len(request.stdin.encode()) if request.stdin is not None else 0
    size += sum(len(arg.encode()) for arg in request.args)
    return size


def known_language(name: str, catalog: LanguageCatalog) -> LanguageInfo:
    """The catalog's language `name`; 400 unknown_language listing the known ones."""
    language = catalog.get(name)
    if language is None:
        known = ", ".join(catalog.names())
        raise GatewayError(
            400,
            "unknown_language",
            f"Unknown language {name!r}; known languages: {known}",
            [
                ErrorDetail(
                    field="body.language", message=f"one of: {known}", type="unknown_language"
                )
            ],
        )
    return language


def _check_language(request: CreateExecutionRequest, catalog: LanguageCatalog) -> None:
    language = known_language(request.language, catalog)
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


def _over_limit(field: str, limit: int | str, kind: str | None = None) -> ErrorDetail:
    return ErrorDetail(
        field=f"body.{field}",
        message=f"at most {limit} for this tenant",
        type=kind or f"max_{field}",
        limit=limit,
    )


def _resource_violations(
    memory: str | None, cpu: str | None, limits: TenantLimits
) -> list[ErrorDetail]:
    violations: list[ErrorDetail] = []
    if memory is not None and parse_quantity(memory) > parse_quantity(limits.max_memory):
        violations.append(_over_limit("memory", limits.max_memory))
    if cpu is not None and parse_quantity(cpu) > parse_quantity(limits.max_cpu):
        violations.append(_over_limit("cpu", limits.max_cpu))
    return violations


def _check_tenant_limits(request: CreateExecutionRequest, tenant: Tenant) -> None:
    limits = tenant.limits
    violations = _resource_violations(request.memory, request.cpu, limits)
    if request.timeout_seconds is not None and request.timeout_seconds > limits.max_timeout_seconds:
        violations.insert(0, _over_limit("timeout_seconds", limits.max_timeout_seconds))
    _refuse_violations(violations)


def _refuse_violations(violations: list[ErrorDetail]) -> None:
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


@dataclass(frozen=True)
class ResolvedLimits:
    timeout_seconds: int
    memory: str
    cpu: str


def default_limits(tenant: Tenant, settings: GatewaySettings) -> ResolvedLimits:
    """The limits of a request that names none: the defaults within the tenant's maximums
    (so a tenant's maximum holds when a request names no value)."""
    limits = tenant.limits
    return ResolvedLimits(
        timeout_seconds=min(settings.default_timeout_seconds, limits.max_timeout_seconds),
        memory=smaller_quantity(settings.default_memory, limits.max_memory),
        cpu=smaller_quantity(settings.default_cpu, limits.max_cpu),
    )


def resolved_limits(
    request: CreateExecutionRequest, tenant: Tenant, settings: GatewaySettings
) -> ResolvedLimits:
    """The execution's limits: the request's, else the tenant's defaults."""
    defaults = default_limits(tenant, settings)
    return ResolvedLimits(
        timeout_seconds=request.timeout_seconds or defaults.timeout_seconds,
        memory=request.memory or defaults.memory,
        cpu=request.cpu or defaults.cpu,
    )


def retry_after_seconds(
    unfinished: list[Resource], now: datetime, max_timeout_seconds: int, default: int
) -> int:
    """Seconds until the oldest unfinished execution must have ended at the latest: created
    plus the tenant's longest timeout (metadata tells no more). 1..60."""
    created = [stamp for stamp in map(created_at, unfinished) if stamp is not None]
    return seconds_until_room(min(created, default=None), now, max_timeout_seconds, default)


def seconds_until_room(
    oldest: datetime | None, now: datetime, max_timeout_seconds: int, default: int
) -> int:
    """Seconds until an execution created at `oldest` must have ended: `default` when none
    runs. 1..60."""
    if oldest is None:
        return default
    remaining = Decimal(max_timeout_seconds) - Decimal(str((now - oldest).total_seconds()))
    soonest = int(remaining.to_integral_value("ROUND_CEILING"))
    return max(1, min(MAX_RETRY_AFTER_SECONDS, soonest))


def unfinished_selector(tenant: str) -> str:
    """The tenant's executions the operator has not labelled finished."""
    return f"{TENANT_LABEL}={tenant},!{FINISHED_LABEL}"


async def check_concurrency(
    service: ExecutionService,
    tenant: Tenant,
    settings: GatewaySettings,
    wanted: int = 1,
    queue_size: int = 0,
) -> bool:
    """Whether `wanted` more executions must wait in the tenant's queue (beyond its
    maxConcurrent, up to `queue_size` more); 429 with Retry-After when they do not fit even
    there. Counts from metadata alone, and reads no more than the limit."""
    limit = tenant.limits.max_concurrent
    unfinished = await service.list_metadata(
        tenant.namespace,
        label_selector=unfinished_selector(tenant.name),
        limit=limit + queue_size,
    )
    if len(unfinished) + wanted > limit + queue_size:
        retry_after = retry_after_seconds(
            unfinished,
            datetime.now(UTC),
            tenant.limits.max_timeout_seconds,
            settings.default_retry_after_seconds,
        )
        raise concurrency_refused(len(unfinished), wanted, limit, retry_after, queue_size)
    return len(unfinished) + wanted > limit


def concurrency_refused(
    running: int, wanted: int, limit: int, retry_after: int, queue_size: int = 0
) -> GatewayError:
    """429 concurrency_limit: `running` executions run (or wait, in a queue of `queue_size`),
    `wanted` more were asked for."""
    waiting = f" and {queue_size} may wait" if queue_size else ""
    return GatewayError(
        429,
        "concurrency_limit",
        f"{running} executions are already running"
        + (" or waiting" if queue_size else "")
        + (f" and {wanted} more were asked for" if wanted > 1 else "")
        + f"; this tenant may run {limit} at once{waiting}.",
        [ErrorDetail(message="too many running", type="max_concurrent", limit=limit)],
        retry_after=retry_after,
    )


def resolved_session_spec(
    request: CreateSessionRequest,
    tenant: Tenant,
    catalog: LanguageCatalog,
    settings: GatewaySettings,
) -> CodeSessionSpec:
    """The session's spec: a known language (400), within the tenant's limits (422), the
    defaults capped by those limits for what the request leaves out."""
    known_language(request.language, catalog)
    limits = tenant.limits
    violations = _resource_violations(request.memory, request.cpu, limits)
    idle, lifetime = request.idle_timeout_seconds, request.max_lifetime_seconds
    if idle is not None and idle > limits.max_idle_timeout_seconds:
        violations.append(_over_limit("idle_timeout_seconds", limits.max_idle_timeout_seconds))
    if lifetime is not None and lifetime > limits.max_lifetime_seconds:
        violations.append(_over_limit("max_lifetime_seconds", limits.max_lifetime_seconds))
    _refuse_violations(violations)
    return CodeSessionSpec(
        language=request.language,
        resources=Resources(
            memory=request.memory or smaller_quantity(settings.default_memory, limits.max_memory),
            cpu=request.cpu or smaller_quantity(settings.default_cpu, limits.max_cpu),
        ),
        network=request.network_spec(),
        idle_timeout_seconds=idle
        or min(DEFAULT_IDLE_TIMEOUT_SECONDS, limits.max_idle_timeout_seconds),
        max_lifetime_seconds=lifetime
        or min(DEFAULT_MAX_LIFETIME_SECONDS, limits.max_lifetime_seconds),
    )


async def check_session_count(
    sessions: SessionService, tenant: Tenant, settings: GatewaySettings
) -> None:
    """429 session_limit when the tenant has as many sessions not yet ended as it may."""
    limit = tenant.limits.max_sessions
    page = await sessions.list(
        tenant.namespace, label_selector=unfinished_selector(tenant.name), limit=None, cursor=None
    )
    live = [session for session in page.items if not is_ended(session)]
    if len(live) >= limit:
        raise session_limit_refused(limit, settings)


def session_limit_refused(limit: int, settings: GatewaySettings) -> GatewayError:
    return GatewayError(
        429,
        "session_limit",
        f"{limit} sessions are open already; this tenant may keep {limit} at once. "
        "Close one (DELETE /v1/sessions/{id}) or let one expire.",
        [ErrorDetail(message="too many sessions", type="max_sessions", limit=limit)],
        retry_after=settings.default_retry_after_seconds,
    )


def stored_bytes_refused(
    kept: int, adding: int, limit: int, settings: GatewaySettings
) -> GatewayError:
    return GatewayError(
        429,
        "stored_bytes_limit",
        f"This tenant's executions keep {kept} bytes and this one brings {adding}; it may keep "
        f"{limit} (maxStoredBytes). Delete finished executions (DELETE /v1/executions/{{id}}) "
        "or wait for them to expire.",
        [ErrorDetail(message="too many bytes kept", type="max_stored_bytes", limit=limit)],
        retry_after=settings.default_retry_after_seconds,
    )
