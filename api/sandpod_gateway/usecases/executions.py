"""The execution use cases: create (admission, idempotency, waiting) and get one's own.

Routers and the MCP tool both call these; they talk to Kubernetes only through an
ExecutionService. Kubernetes being unavailable and not-found are answered by the error
handlers (errors.py).
"""

import hashlib
import json
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from sandpod_contract.models import execution_name_problem
from sandpod_contract.names import TENANT_LABEL
from sandpod_contract.runner import OutputListener

from sandpod_gateway.kube.resources import (
    Resource,
    belongs_to,
    build_code_execution,
    execution_result,
    output_file,
    queued,
    request_fingerprint,
    stored_outputs,
)
from sandpod_gateway.kube.service import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    ExecutionRejected,
    ExecutionService,
    InvalidCursor,
    PageData,
    ResourceNotFound,
)
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.policy.admission import (
    AdmissionControl,
    check_concurrency,
    check_request,
    resolved_limits,
)
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.policy.idempotency import Getter, execution_name, replay
from sandpod_gateway.policy.tenant_counts import OperatorCounts
from sandpod_gateway.schemas import CreateExecutionRequest, ExecutionResult
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.direct_runs import DirectRunner, NotServingNow
from sandpod_gateway.usecases.waiting import finished
from sandpod_gateway.web.errors import ErrorDetail, GatewayError


class Lister(Protocol):
    async def __call__(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData: ...


@dataclass(frozen=True)
class CreateOutcome:
    """A create's answer: its result, whether this call created the execution (False when an
    Idempotency-Key found it made already), and the resource itself."""

    result: ExecutionResult
    created: bool
    resource: Resource


@dataclass(frozen=True)
class ExecutionContext:
    """What the execution use cases need, resolved per request."""

    tenant: Tenant
    executions: ExecutionService
    catalog: LanguageCatalog
    settings: GatewaySettings
    admission: AdmissionControl
    # The direct path to live sandboxes (sessions' and pools'), when the gateway has one.
    direct: DirectRunner | None = None
    # The operator's counts of the tenant, which admit its creates across replicas; without
    # them each replica counts by listing.
    counts: OperatorCounts | None = None


@dataclass(frozen=True)
class Queueing:
    """How an execution may wait in its tenant's queue (created labelled queued; the operator
    starts it in turn): up to `size` of the tenant's beyond its maxConcurrent. `admitted`: the
    caller has checked that it fits (a batch, as a whole), so it is created queued at once and
    the operator's queue alone decides when it runs."""

    size: int
    admitted: bool = False


async def create_execution(
    request: CreateExecutionRequest,
    ctx: ExecutionContext,
    *,
    idempotency_key: str | None,
    wait: bool,
    session: str | None = None,
    name: str | None = None,
    annotations: Mapping[str, str] | None = None,
    queueing: Queueing | None = None,
) -> CreateOutcome:
    """Create (or replay) an execution, in `session` when given, and wait for it if asked.
    A one-off run that waits tries a ready pool sandbox through the direct path first.
    `name` and `annotations`: a compatibility API's own identity for it (a Judge0 token) and
    what that API keeps on it; `queueing`: whether it may wait in the tenant's queue."""
    tenant, service, settings, admission = ctx.tenant, ctx.executions, ctx.settings, ctx.admission
    if ctx.direct is not None and wait and session is None and request.mode == "run":
        outcome = await run_directly(
            request,
            ctx,
            ctx.direct,
            idempotency_key=idempotency_key,
            name=name,
            annotations=annotations,
        )
        if outcome is not None:
            return outcome
    check_request(request, tenant, ctx.catalog, settings)
    name = name or execution_name(tenant.name, idempotency_key)
    fingerprint = request_fingerprint(request, session)
    # A waiting request holds a wait slot from the start: refused replays cost no API call.
    slot: AbstractContextManager[None] = (
        admission.waiting(tenant, name, settings, follows_log=False) if wait else nullcontext()
    )
    with slot:
        try:
            resource = None
            if idempotency_key is not None:
                resource = await replay(service.get, tenant, name, fingerprint)
            created = resource is None
            if resource is None:
                manifest = _manifest(request, name, ctx, session, annotations)
                resource, created = await _admit(manifest, name, ctx, fingerprint, queueing)
            if wait:
                resource = await finished(resource, tenant.namespace, service, settings)
        except ExecutionNotFound as exc:
            raise GatewayError(
                409, "execution_deleted", f"Execution {name!r} was deleted while in use"
            ) from exc
    return CreateOutcome(await result_with_files(resource, tenant, service), created, resource)


async def _admit(
    manifest: Resource,
    name: str,
    ctx: ExecutionContext,
    fingerprint: str,
    queueing: Queueing | None,
) -> tuple[Resource, bool]:
    """Create the execution if the tenant may run another and keep its bytes, or queued while
    its queue has room: (the execution, created?). The operator's counts admit a create that
    cannot queue (creates run in parallel); one that may queue (Judge0's), and every create of
    a gateway without those counts, this replica counts by listing, one of a tenant at a time."""
    tenant, settings, admission = ctx.tenant, ctx.settings, ctx.admission
    limit = tenant.limits.max_concurrent
    if queueing is not None and queueing.admitted:
        return await _create(queued(manifest, limit), name, ctx, fingerprint)
    if queueing is None and ctx.counts is not None:
        size = len(json.dumps(manifest["spec"], separators=(",", ":")).encode())
        await ctx.counts.admit(tenant, "execution", name, size, settings)
        return await _create(manifest, name, ctx, fingerprint)
    async with admission.admitting(tenant.name):
        size = queueing.size if queueing is not None else 0
        if await check_concurrency(ctx.executions, tenant, settings, queue_size=size):
            manifest = queued(manifest, limit)
        return await _create(manifest, name, ctx, fingerprint)


async def _create(
    manifest: Resource, name: str, ctx: ExecutionContext, fingerprint: str
) -> tuple[Resource, bool]:
    tenant, service = ctx.tenant, ctx.executions
    try:
        return await service.create(tenant.namespace, manifest), True
    except ExecutionAlreadyExists:
        existing = await replay(service.get, tenant, name, fingerprint)
        if existing is None:
            raise GatewayError(
                409, "conflict", f"Execution {name!r} is being replaced; retry"
            ) from None
        return existing, False
    except ExecutionRejected as exc:
        raise refused_by_cluster(exc, "execution") from exc


def _manifest(
    request: CreateExecutionRequest,
    name: str,
    ctx: ExecutionContext,
    session: str | None,
    annotations: Mapping[str, str] | None = None,
) -> Resource:
    tenant, settings = ctx.tenant, ctx.settings
    limits = resolved_limits(request, tenant, settings)
    language = ctx.catalog.get(request.language)
    # The tenant's lint rules, for a linter that takes rules.
    takes_rules = language is not None and language.lint_rules is not None
    manifest = build_code_execution(
        name=name,
        tenant=tenant.name,
        request=request,
        timeout_seconds=limits.timeout_seconds,
        memory=None if session else limits.memory,
        cpu=None if session else limits.cpu,
        ttl_seconds_after_finished=settings.ttl_seconds_after_finished,
        session=session,
        lint=tenant.lint if request.mode == "lint" and takes_rules else None,
    )
    manifest["metadata"]["annotations"].update(annotations or {})
    return manifest


async def run_directly(
    request: CreateExecutionRequest,
    ctx: ExecutionContext,
    runner: DirectRunner,
    *,
    session: str | None = None,
    idempotency_key: str | None,
    name: str | None = None,
    annotations: Mapping[str, str] | None = None,
    on_output: OutputListener | None = None,
) -> CreateOutcome | None:
    """A run in a live session, or in a ready sandbox of a pool, through the direct path
    (direct_runs.py): answered by its runner, recorded behind; `on_output` sees its output
    as it comes. A retry with the same Idempotency-Key gets the same run. None when the
    direct path cannot take it now (the session is starting, no pool sandbox fits or is
    free): the caller takes the record path."""
    tenant, service, settings = ctx.tenant, ctx.executions, ctx.settings
    check_request(request, tenant, ctx.catalog, settings)
    name = name or execution_name(tenant.name, idempotency_key)
    # A waiting request holds a wait slot, as on the record path: replays beyond the bound
    # are refused before any API call.
    with ctx.admission.waiting(tenant, name, settings, follows_log=False):
        if idempotency_key is not None:
            fingerprint = request_fingerprint(request, session)
            existing = await replay(service.get, tenant, name, fingerprint)
            if existing is not None:
                resource = await finished(existing, tenant.namespace, service, settings)
                result = await result_with_files(resource, tenant, service)
                return CreateOutcome(result, False, resource)
        manifest = _manifest(request, name, ctx, session, annotations)
        timeout = int((manifest.get("spec") or {}).get("timeoutSeconds") or 0)
        try:
            record = await runner.run(tenant.namespace, manifest, timeout, on_output)
        except NotServingNow:
            return None
        return CreateOutcome(await result_with_files(record, tenant, service), True, record)


def refused_by_cluster(exc: ExecutionRejected, what: str) -> GatewayError:
    return GatewayError(
        422,
        f"invalid_{what}",
        f"The cluster refused the {what}: {exc.message}",
        [ErrorDetail(field=field, message=message) for field, message in exc.causes],
    )


async def get_owned(
    name: str, tenant: Tenant, get: Getter, not_found: type[ResourceNotFound]
) -> Resource:
    """The tenant's execution or session (`get` reads it); `not_found` for anything else,
    another tenant's included."""
    if execution_name_problem(name) is not None:
        raise not_found(name)
    resource = await get(tenant.namespace, name)
    if not belongs_to(resource, tenant.name):
        raise not_found(name)
    return resource


async def result_with_files(
    resource: Resource, tenant: Tenant, service: ExecutionService
) -> ExecutionResult:
    """The result with the output files' content inline, up to the tenant's limit."""
    configmap = stored_outputs(resource)
    limit = tenant.limits.max_inline_file_bytes
    if configmap is None or limit == 0:
        return execution_result(resource)
    contents = await service.read_outputs(tenant.namespace, configmap)
    return execution_result(resource, contents, limit)


async def read_output_file(
    resource: Resource, path: str, tenant: Tenant, service: ExecutionService
) -> tuple[bytes, str]:
    """An output file's content and media type; 404 for a path it does not have."""
    entry = output_file(resource, path)
    if entry is None:
        raise GatewayError(404, "not_found", f"The execution has no output file {path!r}")
    configmap = stored_outputs(resource)
    if not entry.stored or entry.key is None or configmap is None:
        raise GatewayError(
            404,
            "file_not_stored",
            f"The output file {path!r} was not stored (over the per-execution limit)",
        )
    content = (await service.read_outputs(tenant.namespace, configmap)).get(entry.key)
    if content is None or hashlib.sha256(content).hexdigest() != entry.sha256:
        raise GatewayError(404, "file_not_stored", f"The output file {path!r} is gone")
    return content, entry.media_type


async def get_owned_execution(
    execution_id: str, tenant: Tenant, service: ExecutionService
) -> Resource:
    return await get_owned(execution_id, tenant, service.get, ExecutionNotFound)


@dataclass(frozen=True)
class PageQuery:
    """?limit= and ?cursor= of a list request."""

    limit: int
    cursor: str | None


async def list_page(list_function: Lister, tenant: Tenant, query: PageQuery) -> PageData:
    """One page of the tenant's executions or sessions; 400 invalid_cursor."""
    try:
        return await list_function(
            tenant.namespace,
            label_selector=f"{TENANT_LABEL}={tenant.name}",
            limit=query.limit,
            cursor=query.cursor,
        )
    except InvalidCursor as exc:
        raise GatewayError(400, "invalid_cursor", "The cursor is invalid or expired") from exc
