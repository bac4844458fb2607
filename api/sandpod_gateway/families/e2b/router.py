"""E2B's API (/e2b: sandboxes) and its sandboxes' data plane (/e2b/sandbox: the code
interpreter's /execute and /contexts, envd's /health and /files), over sandpod sessions.

E2B's official SDKs work unchanged with E2B_API_URL=<gateway>/e2b,
E2B_SANDBOX_URL=<gateway>/e2b/sandbox and E2B_API_KEY=<API key> (docs/e2b.md). The API
authenticates with the tenant's key (X-API-KEY); the data plane with the sandbox's own access
token (X-Access-Token, or E2B-Traffic-Access-Token, which the code interpreter sends), the
sandbox named by E2b-Sandbox-Id.
"""

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sandpod_contract.names import NDJSON_MEDIA_TYPE, RECORD_DIRECT, RECORD_LABEL, TENANT_LABEL
from sandpod_contract.runner import LiveOutput, OutputListener
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from sandpod_gateway.families.e2b import programs, protocol
from sandpod_gateway.families.e2b.protocol import E2bError
from sandpod_gateway.kube.resources import Resource, is_terminal
from sandpod_gateway.kube.service import ExecutionNotFound, SessionNotFound
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.policy.idempotency import execution_name
from sandpod_gateway.schemas import CreateSessionRequest, ExecutionResult, SessionExecutionRequest
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.executions import get_owned
from sandpod_gateway.usecases.session_commands import exit_status, run_command
from sandpod_gateway.usecases.session_files import download_file, upload_file
from sandpod_gateway.usecases.sessions import (
    SessionContext,
    close_session,
    get_owned_session,
    open_session,
    run_in_session,
)
from sandpod_gateway.web.dependencies import (
    AdmissionDep,
    KeyStoreDep,
    SettingsDep,
    authenticate,
    session_context_of,
)
from sandpod_gateway.web.errors import GatewayError
from sandpod_gateway.web.family_route import FamilyRoute

PREFIX = "/e2b"
SANDBOX_PREFIX = f"{PREFIX}/sandbox"
API_KEY_HEADER = "X-API-KEY"
E2B_FAMILY = "e2b"
CONNECT_JSON = "application/connect+json"
# A command's pid names its run (an unsigned 32-bit number in envd's protocol).
MAX_PID = 2**31 - 1
# A command that did not exit by itself ends as envd ends one killed by a signal.
KILLED_END: dict[str, Any] = {"exited": False, "exitCode": -1, "status": "signal: killed"}


def token_key(settings: GatewaySettings) -> bytes | None:
    """The key E2B access tokens are derived under: from the direct path's token (a secret
    every gateway replica shares), under a label of its own. None without the direct path."""
    if not settings.direct_token_file:
        return None
    secret = Path(settings.direct_token_file).read_bytes().strip()
    return hashlib.sha256(b"sandpod e2b token key\x00" + secret).digest()


def e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


class E2bRoute(FamilyRoute):
    """A route whose errors (its dependencies' included) take E2B's shape."""

    def family_error(self, exc: Exception) -> Response | None:
        if isinstance(exc, E2bError):
            return e2b_error(exc.status, exc.message)
        if isinstance(exc, RequestValidationError):
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(part) for part in first.get("loc", ()))
            return e2b_error(400, f"{where}: {first.get('msg', 'is invalid')}")
        return None

    def gateway_error(self, error: GatewayError) -> Response:
        return e2b_error(error.status_code, error.message, error.headers or None)


api = APIRouter(prefix=PREFIX, tags=["e2b"], route_class=E2bRoute, include_in_schema=False)
data_plane = APIRouter(
    prefix=SANDBOX_PREFIX, tags=["e2b"], route_class=E2bRoute, include_in_schema=False
)


async def api_tenant(
    key_store: KeyStoreDep,
    settings: SettingsDep,
    admission: AdmissionDep,
    x_api_key: Annotated[str | None, Header(alias=API_KEY_HEADER)] = None,
) -> Tenant:
    return await authenticate(x_api_key, key_store, settings, admission, f"{API_KEY_HEADER}: <key>")


ApiContext = Annotated[SessionContext, Depends(session_context_of(api_tenant))]


def key_of(request: Request) -> bytes:
    key: bytes | None = request.app.state.e2b_token_key
    if key is None:
        raise E2bError(503, "E2B sandboxes need the gateway's direct path (chart default)")
    return key


async def sandbox_token(
    access_token: Annotated[str | None, Header(alias="X-Access-Token")] = None,
    traffic_token: Annotated[str | None, Header(alias="E2B-Traffic-Access-Token")] = None,
) -> str:
    token = access_token or traffic_token
    if token is None:
        raise E2bError(401, "Missing the sandbox's access token (X-Access-Token)")
    return token


SandboxToken = Annotated[str, Depends(sandbox_token)]
SandboxId = Annotated[str, Header(alias="E2b-Sandbox-Id")]


async def sandbox_tenant(
    request: Request,
    key_store: KeyStoreDep,
    settings: SettingsDep,
    admission: AdmissionDep,
    token: SandboxToken,
    sandbox_id: SandboxId = "",
) -> Tenant:
    """The tenant of the sandbox named by E2b-Sandbox-Id, by its access token (401 unless the
    token was made for that sandbox; whether for the session under that id now, sandbox_call
    checks)."""
    key = key_of(request)
    tenant = await key_store.tenant(protocol.token_claim(token).tenant)
    if tenant is None or not protocol.token_matches(key, token, sandbox_id):
        raise E2bError(401, "Invalid access token for this sandbox")
    admission.count_request(tenant, settings.replicas)
    return tenant


SandboxContext = Annotated[SessionContext, Depends(session_context_of(sandbox_tenant))]


class ModuleInstalled:
    """Sandboxes this replica has given the session module (bounded, oldest out): a call to
    one sends no module; a call to another sends it, so that a first call is one run."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __contains__(self, sandbox: tuple[str, str]) -> bool:
        return sandbox in self._seen

    def add(self, sandbox: tuple[str, str]) -> None:
        self._seen[sandbox] = None
        self._seen.move_to_end(sandbox)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)


@dataclass(frozen=True)
class SandboxCall:
    """A data-plane request: the sandbox it names, its tenant's context, where this replica
    notes which sandboxes have the session module, and the sandbox's session as read for this
    request (once: its calls use this read)."""

    sandbox_id: str
    ctx: SessionContext
    installed: ModuleInstalled
    session: Resource

    @property
    def sandbox(self) -> tuple[str, str]:
        return self.ctx.tenant.name, self.sandbox_id


async def _token_session(sandbox_id: str, token: str, ctx: SessionContext) -> Resource:
    """The running session the token was made for: 404 when none runs under that id, 401 when
    the session under that id is another (the sandbox was killed and created again). So a
    token lasts as long as its sandbox: until its end, which set_timeout and connect move.
    The read is also what this replica knows of the session from now on."""
    session = await _owned(sandbox_id, ctx)
    if protocol.session_uid(session) != protocol.token_claim(token).uid:
        raise E2bError(401, "This access token is an earlier sandbox's with this id")
    await _check_running(sandbox_id, session, ctx)
    ctx.known.remember(ctx.tenant.name, sandbox_id, session)
    return session


async def sandbox_call(
    request: Request, ctx: SandboxContext, token: SandboxToken, sandbox_id: SandboxId = ""
) -> SandboxCall:
    installed: ModuleInstalled = request.app.state.e2b_module_installed
    checked = protocol.checked_sandbox_id(sandbox_id)
    session = await _token_session(checked, token, ctx)
    return SandboxCall(checked, ctx, installed, session)


SandboxCallDep = Annotated[SandboxCall, Depends(sandbox_call)]


# -- the API ---------------------------------------------------------------------------------


class NewSandbox(BaseModel):
    """E2B's NewSandbox; what sandpod cannot do is refused by name, the rest ignored."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    template_id: str = Field(alias="templateID", min_length=1, max_length=128)
    timeout: int = Field(default=protocol.DEFAULT_TIMEOUT_SECONDS, ge=1, le=86400)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    auto_pause: bool = Field(default=False, alias="autoPause")
    allow_internet_access: bool | None = None


class TimeoutBody(BaseModel):
    timeout: int = Field(ge=1, le=86400)


class ConnectBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    timeout: int | None = Field(default=None, ge=1, le=86400)


def _token(request: Request, tenant: Tenant, sandbox_id: str, session: Resource) -> str:
    uid = protocol.session_uid(session)
    return protocol.access_token(key_of(request), tenant.name, sandbox_id, uid)


def _session_request(language: str, tenant: Tenant) -> CreateSessionRequest:
    """E2B's sandbox lives until its end (END_ANNOTATION), idle or not: the session gets the
    tenant's longest idle timeout and lifetime, within which that end is set and moved."""
    limits = tenant.limits
    return CreateSessionRequest(
        language=language,
        idle_timeout_seconds=limits.max_idle_timeout_seconds,
        max_lifetime_seconds=limits.max_lifetime_seconds,
    )


async def _create(body: NewSandbox, request: Request, ctx: SessionContext) -> dict[str, Any]:
    if body.auto_pause:
        raise E2bError(400, "autoPause: sandpod sandboxes cannot be paused")
    if body.allow_internet_access:
        raise E2bError(
            403,
            "allow_internet_access: sandpod sandboxes have no network (the tenant's egress "
            "allows none through the E2B API); create it with allow_internet_access=False",
        )
    language = protocol.template_language(body.template_id)
    metadata = protocol.checked_metadata(body.metadata)
    envs = protocol.checked_metadata(body.env_vars)
    now = protocol.now()
    outcome = await open_session(
        _session_request(language, ctx.tenant),
        ctx,
        request.headers.get("Idempotency-Key"),
        labels={protocol.FAMILY_LABEL: E2B_FAMILY},
        annotations=protocol.sandbox_annotations(
            body.template_id, metadata, envs, now, protocol.end_at(now, body.timeout)
        ),
    )
    session_id = outcome.session.id
    token = _token(request, ctx.tenant, session_id, outcome.resource)
    return protocol.created_sandbox(session_id, body.template_id, token)


@api.post("/sandboxes", status_code=201)
@api.post("/v2/sandboxes", status_code=201)
async def create_sandbox(body: NewSandbox, request: Request, ctx: ApiContext) -> dict[str, Any]:
    return await _create(body, request, ctx)


async def _owned(sandbox_id: str, ctx: SessionContext) -> Resource:
    try:
        return await get_owned_session(
            protocol.checked_sandbox_id(sandbox_id), ctx.tenant, ctx.sessions
        )
    except SessionNotFound:
        raise E2bError(404, f"sandbox {sandbox_id!r} not found") from None


async def _check_running(sandbox_id: str, session: Resource, ctx: SessionContext) -> None:
    """404 unless the sandbox runs; one past its end is killed now."""
    now = protocol.now()
    if protocol.is_expired(session, now):
        await _kill(sandbox_id, ctx)
    if not protocol.is_running(session, now):
        raise E2bError(404, f"sandbox {sandbox_id!r} not found (it has ended)")


async def _live(sandbox_id: str, ctx: SessionContext) -> Resource:
    """The tenant's running sandbox (404 unless it runs)."""
    session = await _owned(sandbox_id, ctx)
    await _check_running(sandbox_id, session, ctx)
    return session


async def _kill(sandbox_id: str, ctx: SessionContext) -> None:
    try:
        await close_session(sandbox_id, ctx)
    except SessionNotFound:
        raise E2bError(404, f"sandbox {sandbox_id!r} not found") from None


async def _e2b_sessions(ctx: SessionContext) -> list[Resource]:
    """The tenant's running E2B sandboxes (its other sessions are not E2B's)."""
    selector = f"{TENANT_LABEL}={ctx.tenant.name},{protocol.FAMILY_LABEL}={E2B_FAMILY}"
    page = await ctx.sessions.list(
        ctx.tenant.namespace, label_selector=selector, limit=None, cursor=None
    )
    now = protocol.now()
    return [s for s in page.items if protocol.is_running(s, now)]


async def _list(
    ctx: SessionContext,
    response: Response,
    wanted: protocol.SandboxFilter,
    state: str | None,
    limit: int,
    next_token: str | None,
    order: str,
) -> list[dict[str, Any]]:
    states = set((state or "running").split(","))
    sessions = [s for s in await _e2b_sessions(ctx) if wanted.admits(s)]
    if "running" not in states:
        sessions = []
    page, token = protocol.page_of(sessions, limit, next_token, order)
    if token is not None:
        response.headers["x-next-token"] = token
    now = protocol.now()
    return [protocol.listed_sandbox(s, now) for s in page]


@api.get("/v2/sandboxes")
async def list_sandboxes(
    ctx: ApiContext,
    response: Response,
    metadata: Annotated[str | None, Query(max_length=protocol.MAX_METADATA_CHARS)] = None,
    state: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=253)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    started_after: Annotated[datetime | None, Query(alias="startedAfter")] = None,
    template: Annotated[str | None, Query(max_length=128)] = None,
) -> list[dict[str, Any]]:
    wanted = protocol.SandboxFilter(protocol.metadata_query(metadata), template, started_after)
    return await _list(ctx, response, wanted, state, limit, next_token, order)


@api.get("/sandboxes")
async def list_sandboxes_v1(
    ctx: ApiContext,
    response: Response,
    metadata: Annotated[str | None, Query(max_length=protocol.MAX_METADATA_CHARS)] = None,
) -> list[dict[str, Any]]:
    wanted = protocol.SandboxFilter(protocol.metadata_query(metadata))
    return await _list(ctx, response, wanted, None, 1000, None, "desc")


@api.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, request: Request, ctx: ApiContext) -> dict[str, Any]:
    session = await _live(sandbox_id, ctx)
    token = _token(request, ctx.tenant, sandbox_id, session)
    return {
        **protocol.listed_sandbox(session, protocol.now()),
        "envdAccessToken": token,
        "domain": None,
    }


@api.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill_sandbox(sandbox_id: str, ctx: ApiContext) -> Response:
    await _live(sandbox_id, ctx)
    await _kill(sandbox_id, ctx)
    return Response(status_code=204)


async def _set_end(sandbox_id: str, ctx: SessionContext, timeout: int) -> Resource:
    session = await _live(sandbox_id, ctx)
    end = protocol.end_at(protocol.now(), timeout)
    started = session["metadata"].get("creationTimestamp")
    protocol.check_end(end, started, ctx.tenant.limits.max_lifetime_seconds)
    return await ctx.sessions.annotate(
        ctx.tenant.namespace, sandbox_id, {protocol.END_ANNOTATION: end}
    )


@api.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, body: TimeoutBody, ctx: ApiContext) -> Response:
    await _set_end(sandbox_id, ctx, body.timeout)
    return Response(status_code=204)


@api.post("/sandboxes/{sandbox_id}/connect")
@api.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect_sandbox(
    sandbox_id: str, body: ConnectBody, request: Request, ctx: ApiContext
) -> dict[str, Any]:
    session = (
        await _set_end(sandbox_id, ctx, body.timeout)
        if body.timeout is not None
        else await _live(sandbox_id, ctx)
    )
    token = _token(request, ctx.tenant, sandbox_id, session)
    return protocol.created_sandbox(sandbox_id, protocol.sandbox_template(session), token)


UNSUPPORTED = {
    "pause": "sandpod sandboxes cannot be paused (a session keeps its pod until it ends)",
    "resume": "sandpod sandboxes cannot be paused, so none is resumed",
    "snapshots": "sandpod has no sandbox snapshots",
    "fork": "sandpod sandboxes cannot be forked",
    "refreshes": "refresh with set_timeout",
    "network": "a sandbox's network is fixed when it is created",
    "metrics": "sandpod does not serve sandbox metrics through the E2B API",
    "logs": "sandpod does not serve sandbox logs through the E2B API (kubectl get cx)",
}


@api.api_route("/sandboxes/{sandbox_id}/{action}", methods=["GET", "POST", "PUT"])
@api.api_route("/v2/sandboxes/{sandbox_id}/{action}", methods=["GET", "POST", "PUT"])
async def unsupported(sandbox_id: str, action: str, _ctx: ApiContext) -> Response:
    reason = UNSUPPORTED.get(action, f"sandpod does not serve {action!r}")
    raise E2bError(400 if action in UNSUPPORTED else 404, reason)


# -- the data plane --------------------------------------------------------------------------


class ExecuteBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str = Field(max_length=protocol.MAX_CODE_CHARS)
    context_id: str | None = Field(default=None, max_length=128)
    language: str | None = Field(default=None, max_length=32)
    env_vars: dict[str, str] | None = None


async def _run(
    call: SandboxCall,
    code: str,
    on_output: OutputListener | None = None,
    name: str | None = None,
) -> ExecutionResult:
    body = SessionExecutionRequest(code=code)
    outcome = await run_in_session(
        call.sandbox_id,
        body,
        call.ctx,
        idempotency_key=None,
        wait=True,
        on_output=on_output,
        name=name,
        session=call.session,
    )
    return outcome.result


@data_plane.get("/health", status_code=204)
async def health(ctx: SandboxContext, token: SandboxToken, sandbox_id: SandboxId = "") -> Response:
    """204 while the sandbox runs, 502 once it does not (the SDK's is_running() False)."""
    checked = protocol.checked_sandbox_id(sandbox_id)
    try:
        await _token_session(checked, token, ctx)
    except E2bError as exc:
        if exc.status != 404:
            raise
        return Response(status_code=502)
    return Response(status_code=204)


async def _module_call(
    call: SandboxCall, op: str, args: dict[str, Any], on_output: OutputListener | None = None
) -> ExecutionResult:
    """One run calling the session's _sandpod_e2b, installing it first in a sandbox this
    replica has not given it yet; one without it after all (restarted, or given another
    version) answers so without running anything, and gets it with the call again."""
    install = call.sandbox not in call.installed
    result = await _run(call, programs.session_call(op, args, install=install), on_output)
    if not install and result.result == programs.MODULE_MISSING:
        install = protocol.failure_error(result) is None
        if install:
            result = await _run(call, programs.session_call(op, args, install=True), on_output)
    if install and protocol.failure_error(result) is None:
        call.installed.add(call.sandbox)
    return result


async def _module_answer(call: SandboxCall, op: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await _module_call(call, op, args)
    failure = protocol.failure_error(result)
    if failure is not None:
        raise E2bError(502, f"the sandbox's session failed: {failure['value']}")
    try:
        return protocol.session_answer(result.result)
    except protocol.MalformedAnswer as exc:
        raise E2bError(502, str(exc)) from None


def _context_id(context_id: str | None) -> str:
    found = context_id or protocol.DEFAULT_CONTEXT
    if not protocol.CONTEXT_ID.match(found):
        raise E2bError(404, f"context {found!r} not found")
    return found


@data_plane.post("/execute")
async def execute(body: ExecuteBody, call: SandboxCallDep) -> StreamingResponse:
    if body.language not in (None, "python"):
        raise E2bError(400, f"language {body.language!r}: this sandbox runs python")
    args = {
        "code": protocol.cell_code(body.code, body.language),
        "context": _context_id(body.context_id),
        "sandbox_envs": protocol.sandbox_envs(call.session),
        "envs": protocol.checked_metadata(body.env_vars),
    }
    live = LiveOutput()
    running = asyncio.ensure_future(_module_call(call, "cell", args, live.put))
    if not await live.started(running):
        result = running.result()
        if protocol.failure_error(result) is None:
            # An unknown context is refused (404) before anything streams.
            with contextlib.suppress(protocol.MalformedAnswer):
                protocol.session_answer(result.result)
        return StreamingResponse(
            _lines(protocol.execute_lines(result)), media_type=NDJSON_MEDIA_TYPE
        )
    return StreamingResponse(_live_lines(live, running), media_type=NDJSON_MEDIA_TYPE)


async def _lines(lines: list[str]) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def _live_lines(
    live: LiveOutput, running: "asyncio.Future[ExecutionResult]"
) -> AsyncIterator[str]:
    """The cell's output as its runner sends it, then what the verified result adds."""
    try:
        async for chunk in live.chunks(running):
            yield protocol.log_line(chunk.stream, chunk.data)
        lines = protocol.execute_lines(running.result(), logs_streamed=True)
    except (E2bError, GatewayError) as exc:
        lines = protocol.failed_lines(exc.message)
    for line in lines:
        yield line


class NewContext(BaseModel):
    model_config = ConfigDict(extra="allow")

    language: str | None = Field(default=None, max_length=32)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)


@data_plane.post("/contexts")
async def create_context(body: NewContext, call: SandboxCallDep) -> dict[str, Any]:
    if body.language not in (None, "python"):
        raise E2bError(400, f"language {body.language!r}: this sandbox runs python")
    args = {"id": protocol.new_context_id(), "cwd": programs.work_path(body.cwd or protocol.HOME)}
    answer = await _module_answer(call, "create", args)
    return dict(answer.get("context") or {})


@data_plane.get("/contexts")
async def list_contexts(call: SandboxCallDep) -> list[dict[str, Any]]:
    answer = await _module_answer(call, "list", {})
    return list(answer.get("contexts") or [])


@data_plane.post("/contexts/{context_id}/restart", status_code=204)
async def restart_context(context_id: str, call: SandboxCallDep) -> Response:
    await _module_answer(call, "restart", {"id": _context_id(context_id)})
    return Response(status_code=204)


@data_plane.delete("/contexts/{context_id}", status_code=204)
async def remove_context(context_id: str, call: SandboxCallDep) -> Response:
    if context_id == protocol.DEFAULT_CONTEXT:
        raise E2bError(400, "the default context cannot be removed (restart it instead)")
    await _module_answer(call, "remove", {"id": _context_id(context_id)})
    return Response(status_code=204)


async def _call(call: SandboxCall, program: str) -> tuple[ExecutionResult, dict[str, Any]]:
    result = await _run(call, program)
    return result, programs.answer_of(result.result)


CONNECT_STATUS = {
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "invalid_argument": 400,
    "unimplemented": 404,
}


def connect_error(code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=CONNECT_STATUS[code])


@data_plane.post("/filesystem.Filesystem/{method}")
async def filesystem(method: str, request: Request, call: SandboxCallDep) -> Response:
    """envd's filesystem calls (Connect, unary, JSON), each a program run in the session."""
    if method not in programs.FILESYSTEM_CALLS:
        return connect_error("unimplemented", f"sandpod does not serve filesystem.{method}")
    try:
        args = json.loads(await request.body() or b"{}")
    except ValueError:
        return connect_error("invalid_argument", "the body is not JSON")
    if not isinstance(args, dict):
        return connect_error("invalid_argument", "the body is not a JSON object")
    _, answer = await _call(call, programs.filesystem_program(method, args))
    error = answer.pop("error", None)
    if isinstance(error, list) and len(error) == 2 and error[0] in CONNECT_STATUS:
        return connect_error(str(error[0]), str(error[1]))
    return JSONResponse(answer)


@data_plane.get("/files")
async def read_file(
    call: SandboxCallDep, path: Annotated[str, Query(min_length=1, max_length=4096)]
) -> Response:
    try:
        data = await download_file(
            call.sandbox_id, programs.relative_path(path), call.ctx, session=call.session
        )
    except GatewayError as exc:
        if exc.code == "file_not_found":
            raise E2bError(404, f"file {path!r} not found") from exc
        raise
    return Response(data, media_type="application/octet-stream")


def _written(path: str) -> dict[str, str]:
    name = path.rstrip("/").rpartition("/")[2]
    return {
        "name": name,
        "type": "file",
        "path": path if path.startswith("/") else f"{protocol.HOME}/{path}",
    }


async def _file_parts(request: Request, ctx: SessionContext) -> list[UploadFile | str]:
    """A multipart body's parts named "file", at most max_upload_parts of them (400
    beyond); each after the first counts as one more request against the tenant's rate, as
    each is a run in the sandbox."""
    bound = ctx.settings.max_upload_parts
    try:
        form = await request.form(max_files=bound, max_fields=bound)
    except HTTPException as exc:
        raise E2bError(
            400, f"the multipart body is refused: {exc.detail} (an upload holds {bound} files)"
        ) from None
    parts = form.getlist("file")
    for _ in parts[1:]:
        ctx.admission.count_request(ctx.tenant, ctx.settings.replicas)
    return parts


@data_plane.post("/files")
async def write_files(
    request: Request,
    call: SandboxCallDep,
    path: Annotated[str | None, Query(min_length=1, max_length=4096)] = None,
) -> list[dict[str, str]]:
    """One file as application/octet-stream, or files as multipart parts named "file" (the
    part's filename is its path when the query names none); a body or part sent with
    Content-Encoding gzip is stored decompressed."""
    limit = call.ctx.tenant.limits.max_file_bytes
    encoding = request.headers.get("content-encoding")
    entries: list[tuple[str, bytes]] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        if not protocol.is_identity(encoding):
            raise E2bError(415, "a multipart body is not compressed as a whole (its parts may be)")
        for part in await _file_parts(request, call.ctx):
            if isinstance(part, str):
                raise E2bError(400, "a file part carries no file")
            where = path or part.filename
            if not where:
                raise E2bError(400, "a file part names no path")
            data = await part.read()
            entries.append(
                (where, protocol.decoded_upload(data, part.headers.get("content-encoding"), limit))
            )
    else:
        if path is None:
            raise E2bError(400, "path: required for an application/octet-stream upload")
        entries.append((path, protocol.decoded_upload(await request.body(), encoding, limit)))
    written = []
    for where, data in entries:
        await upload_file(
            call.sandbox_id,
            programs.relative_path(where),
            data,
            call.ctx,
            binary=True,
            session=call.session,
        )
        written.append(_written(where))
    return written


def _envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return bytes([flags]) + len(data).to_bytes(4, "big") + data


def _first_message(body: bytes) -> dict[str, Any]:
    """The first message of a Connect streaming request (5-byte envelope, then JSON)."""
    if len(body) < 5 or body[0] & 0x01:
        raise E2bError(400, "a Connect streaming request (uncompressed) was expected")
    size = int.from_bytes(body[1:5], "big")
    try:
        message = json.loads(body[5 : 5 + size])
    except ValueError:
        raise E2bError(400, "the request message is not JSON") from None
    if not isinstance(message, dict):
        raise E2bError(400, "the request message is not a JSON object")
    return message


def _start_event(pid: int) -> bytes:
    return _envelope({"event": {"start": {"pid": pid}}})


def _data_event(stream: str, text: str) -> bytes:
    return _envelope({"event": {"data": {stream: base64.b64encode(text.encode()).decode()}}})


def _end(end: dict[str, Any]) -> list[bytes]:
    return [_envelope({"event": {"end": end}}), _envelope({}, flags=0x02)]


def _end_events(language: str, result: ExecutionResult, streamed: bool) -> list[bytes]:
    """The output the run's result has (when none streamed live), then its end."""
    logs = () if streamed else (("stdout", result.stdout), ("stderr", result.stderr))
    data = [_data_event(stream, text) for stream, text in logs if text]
    exit_code = exit_status(language, result)
    if exit_code is None:
        end = KILLED_END
    else:
        end = {"exited": True, "exitCode": exit_code, "status": f"exit status {exit_code}"}
    failure = protocol.failure_error(result)
    if failure is not None:
        end = {**end, "error": failure["value"]}
    return [*data, *_end(end)]


async def _process_events(
    pid: int, live: LiveOutput, running: "asyncio.Future[tuple[str, ExecutionResult]]"
) -> AsyncIterator[bytes]:
    yield _start_event(pid)
    streamed = False
    try:
        async for chunk in live.chunks(running):
            streamed = True
            yield _data_event(chunk.stream, chunk.data)
        events = _end_events(*running.result(), streamed)
    except (E2bError, GatewayError) as exc:
        events = _end({**KILLED_END, "error": exc.message})
    for event in events:
        yield event


def _process_run_name(call: SandboxCall, pid: int) -> str:
    """The name of the run of a sandbox's process: any replica finds it again by the pid."""
    return execution_name(call.ctx.tenant.name, f"e2b-process\n{call.sandbox_id}\n{pid}")


@data_plane.post("/process.Process/Start")
async def start_process(request: Request, call: SandboxCallDep) -> StreamingResponse:
    """envd's Start: the command runs as a run in the session; Start's events tell its pid at
    once, stream its output while it runs (on the direct path), then its exit code."""
    process = _first_message(await request.body()).get("process") or {}
    argv = [str(process.get("cmd") or ""), *[str(a) for a in process.get("args") or []]]
    envs = protocol.checked_metadata(process.get("envs"))
    pid = secrets.randbelow(MAX_PID) + 1
    live = LiveOutput()
    running = asyncio.ensure_future(
        run_command(
            call.sandbox_id,
            argv,
            cwd=programs.work_path(process.get("cwd") or protocol.HOME),
            env=envs,
            ctx=call.ctx,
            on_output=live.put,
            name=_process_run_name(call, pid),
            session=call.session,
        )
    )
    return StreamingResponse(_process_events(pid, live, running), media_type=CONNECT_JSON)


async def _stop(call: SandboxCall, name: str) -> bool:
    """Stop the run of that name, if it has not ended: on the direct path at once, else (one
    the record path took) by its record. Whether one was stopped."""
    ctx = call.ctx
    if ctx.direct is not None and await ctx.direct.cancel(ctx.tenant.namespace, name):
        return True
    try:
        execution = await get_owned(name, ctx.tenant, ctx.executions.get, ExecutionNotFound)
    except ExecutionNotFound:
        return False
    # A direct run's record gets its final status behind the answer: the operator, which
    # runs every direct run, has just said this one is not in progress.
    if is_terminal(execution) or is_direct_record(execution):
        return False
    await ctx.executions.cancel(ctx.tenant.namespace, name)
    return True


def is_direct_record(execution: Resource) -> bool:
    labels = (execution.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(RECORD_LABEL) == RECORD_DIRECT)


@data_plane.post("/process.Process/SendSignal")
async def send_signal(request: Request, call: SandboxCallDep) -> Response:
    """envd's SendSignal (the SDK's kill): SIGKILL and SIGTERM alike stop the command's run;
    a pid with no run in progress is not_found, which the SDK reads as False."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    process = body.get("process") if isinstance(body, dict) else None
    pid = process.get("pid") if isinstance(process, dict) else None
    if not isinstance(pid, int) or not 0 < pid <= MAX_PID:
        return connect_error("invalid_argument", "a process is named by its pid")
    if not await _stop(call, _process_run_name(call, pid)):
        return connect_error("not_found", f"process with pid {pid} not found")
    return JSONResponse({})


@data_plane.post("/process.Process/List")
async def list_processes(_call: SandboxCallDep) -> dict[str, Any]:
    return {"processes": []}


@data_plane.post("/process.Process/{method}")
async def other_process_call(method: str, _call: SandboxCallDep) -> Response:
    return connect_error(
        "unimplemented",
        f"sandpod does not serve process.{method}: a command runs to its end or its kill (no "
        "input, pty or reconnects)",
    )


# Included after `api` and `data_plane`: what neither serves under /e2b answers in E2B's shape
# (the SDK reads `code` from any error), not the gateway's.
unserved = APIRouter(prefix=PREFIX, tags=["e2b"], include_in_schema=False)


@unserved.api_route("/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(path: str, request: Request) -> Response:
    return e2b_error(404, f"sandpod does not serve {request.method} {PREFIX}/{path[:200]}")
