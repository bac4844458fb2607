"""The session use cases: open (admission, idempotency), get one's own, close, run code in
one, and move files in and out of one.

Routers and the MCP tools both call these. A run in a session is a CodeExecution naming it
(executions.create_execution does the rest), and so are file transfers: they queue with the
session's other runs and are audited like them.
"""

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, fields

from sandpod_contract.runner import OutputListener

from sandpod_gateway.kube.resources import (
    Resource,
    build_code_session,
    is_ended,
    request_fingerprint,
    session_info,
)
from sandpod_gateway.kube.service import (
    ExecutionRejected,
    SessionAlreadyExists,
    SessionNotFound,
    SessionService,
)
from sandpod_gateway.policy.admission import check_session_count, resolved_session_spec
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.policy.idempotency import SESSION_PREFIX, replay, resource_name
from sandpod_gateway.schemas import (
    CreateExecutionRequest,
    CreateSessionRequest,
    SessionExecutionRequest,
    SessionInfo,
)
from sandpod_gateway.usecases.executions import (
    CreateOutcome,
    ExecutionContext,
    create_execution,
    get_owned,
    refused_by_cluster,
    run_directly,
)
from sandpod_gateway.web.errors import ErrorDetail, GatewayError


@dataclass(frozen=True)
class SessionOutcome:
    session: SessionInfo
    created: bool
    resource: Resource


class KnownSessions:
    """Sessions this replica has read, by tenant and name, as first read: what never changes
    of one (its tenant, language, uid), so that a run through the direct path reads nothing
    first; whether the session still serves is the operator's word there. Bounded, oldest
    first out."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[str, str], Resource] = OrderedDict()

    def get(self, tenant: str, name: str) -> Resource | None:
        return self._seen.get((tenant, name))

    def remember(self, tenant: str, name: str, session: Resource) -> None:
        self._seen[(tenant, name)] = session
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)

    def forget(self, tenant: str, name: str) -> None:
        self._seen.pop((tenant, name), None)


@dataclass(frozen=True, kw_only=True)
class SessionContext(ExecutionContext):
    """What the session use cases need, resolved per request."""

    sessions: SessionService
    known: KnownSessions

    @classmethod
    def of(
        cls, ctx: ExecutionContext, sessions: SessionService, known: KnownSessions
    ) -> "SessionContext":
        """The execution context `ctx` and what the session use cases need besides."""
        shared = {field.name: getattr(ctx, field.name) for field in fields(ExecutionContext)}
        return cls(**shared, sessions=sessions, known=known)


async def open_session(
    request: CreateSessionRequest,
    ctx: SessionContext,
    idempotency_key: str | None,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> SessionOutcome:
    """Open a session; an API family adds its own labels and annotations (an E2B sandbox's
    template and metadata)."""
    spec = resolved_session_spec(request, ctx.tenant, ctx.catalog, ctx.settings)
    tenant = ctx.tenant
    name = resource_name(SESSION_PREFIX, tenant.name, idempotency_key)
    fingerprint = request_fingerprint(request)
    if idempotency_key is not None:
        existing = await replay(ctx.sessions.get, tenant, name, fingerprint)
        if existing is not None:
            return SessionOutcome(session_info(existing), False, existing)
    manifest = build_code_session(name=name, tenant=tenant.name, request=request, spec=spec)
    manifest["metadata"]["labels"].update(labels or {})
    manifest["metadata"]["annotations"].update(annotations or {})
    if ctx.counts is not None:
        await ctx.counts.admit(tenant, "session", name, 0, ctx.settings)
        return await _create_session(manifest, name, ctx, fingerprint)
    # Its own lock: counting sessions does not hold up the tenant's executions.
    async with ctx.admission.admitting(f"sessions/{tenant.name}"):
        await check_session_count(ctx.sessions, tenant, ctx.settings)
        return await _create_session(manifest, name, ctx, fingerprint)


async def _create_session(
    manifest: Resource, name: str, ctx: SessionContext, fingerprint: str
) -> SessionOutcome:
    tenant = ctx.tenant
    try:
        created = await ctx.sessions.create(tenant.namespace, manifest)
    except SessionAlreadyExists:
        existing = await replay(ctx.sessions.get, tenant, name, fingerprint)
        if existing is None:
            raise GatewayError(
                409, "conflict", f"Session {name!r} is being replaced; retry"
            ) from None
        return SessionOutcome(session_info(existing), False, existing)
    except ExecutionRejected as exc:
        raise refused_by_cluster(exc, "session") from exc
    return SessionOutcome(session_info(created), True, created)


async def get_owned_session(session_id: str, tenant: Tenant, sessions: SessionService) -> Resource:
    return await get_owned(session_id, tenant, sessions.get, SessionNotFound)


async def close_session(session_id: str, ctx: SessionContext) -> tuple[SessionInfo, bool]:
    """Delete the session (the operator ends it and its pod): (its last view, whether this
    request ended it). An ended session is answered as it is."""
    resource = await get_owned_session(session_id, ctx.tenant, ctx.sessions)
    if is_ended(resource):
        return session_info(resource), False
    await ctx.sessions.delete(ctx.tenant.namespace, session_id)
    ctx.known.forget(ctx.tenant.name, session_id)
    return session_info(resource), True


async def live_session(session_id: str, ctx: SessionContext) -> Resource:
    """The tenant's session, refused with 409 session_ended once it has ended."""
    resource = await get_owned_session(session_id, ctx.tenant, ctx.sessions)
    if is_ended(resource):
        info = session_info(resource)
        raise GatewayError(
            409,
            "session_ended",
            f"Session {session_id!r} has ended ({info.reason or 'ended'}); open a new one.",
        )
    return resource


def _session_language(body: SessionExecutionRequest, session: Resource) -> str:
    language = str((session.get("spec") or {}).get("language", ""))
    if body.language is not None and body.language != language:
        raise GatewayError(
            422,
            "language_mismatch",
            f"The session runs {language}, not {body.language}.",
            [ErrorDetail(field="body.language", message=f"must be {language}", type="session")],
        )
    return language


async def run_in_session(
    session_id: str,
    body: SessionExecutionRequest,
    ctx: SessionContext,
    *,
    idempotency_key: str | None,
    wait: bool,
    on_output: OutputListener | None = None,
    name: str | None = None,
    session: Resource | None = None,
) -> CreateOutcome:
    """An execution in the session (same limits and answers as any other): through the
    direct path when the gateway has one and the caller waits, else created and reconciled.
    A lint needs none of the session's state: it runs beside it, as a one-off execution.
    `on_output` sees the output as it comes on the direct path (the record path has it in
    the result only); `name`: a compatibility API's own name for the run (E2B's process);
    `session`: the caller's read of the session in this request, if it made one."""
    direct = ctx.direct is not None and wait
    tenant = ctx.tenant.name
    read_now = session is not None
    if session is None and direct:
        session = ctx.known.get(tenant, session_id)
    if session is None:
        session = await live_session(session_id, ctx)
        ctx.known.remember(tenant, session_id, session)
        read_now = True
    fields = body.model_dump(exclude_unset=True, exclude={"language"})
    request = CreateExecutionRequest(language=_session_language(body, session), **fields)
    if request.mode == "lint":
        return await create_execution(request, ctx, idempotency_key=idempotency_key, wait=wait)
    if direct and ctx.direct is not None:
        try:
            outcome = await run_directly(
                request,
                ctx,
                ctx.direct,
                session=session_id,
                idempotency_key=idempotency_key,
                on_output=on_output,
                name=name,
            )
        except SessionNotFound:
            ctx.known.forget(tenant, session_id)
            raise
        if outcome is not None:
            return outcome
        if not read_now:  # the record path answers a session that has ended with 409
            await live_session(session_id, ctx)
    return await create_execution(
        request, ctx, idempotency_key=idempotency_key, wait=wait, session=session_id, name=name
    )
