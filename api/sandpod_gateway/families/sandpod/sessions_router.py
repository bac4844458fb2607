"""/v1/sessions: open, get, list, close; run code in one; upload and download its files."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from sandpod_contract.models import RELATIVE_PATH_PATTERN
from sandpod_contract.runner import LiveOutput

from sandpod_gateway.kube.resources import Resource, session_info
from sandpod_gateway.kube.service import ExecutionNotFound
from sandpod_gateway.schemas import (
    CreateSessionRequest,
    ExecutionResult,
    SessionCommandRequest,
    SessionExecutionRequest,
    SessionInfo,
    SessionPage,
    TrustedName,
)
from sandpod_gateway.usecases.executions import CreateOutcome, get_owned_execution, list_page
from sandpod_gateway.usecases.session_commands import SHELL, command_result, run_command
from sandpod_gateway.usecases.session_files import FileInfo, download_file, upload_file
from sandpod_gateway.usecases.sessions import (
    close_session,
    get_owned_session,
    open_session,
    run_in_session,
)
from sandpod_gateway.usecases.streaming import execution_events, live_events
from sandpod_gateway.web.common import (
    COMMON_ERRORS,
    CreateCallDep,
    IdempotencyKey,
    PageParams,
)
from sandpod_gateway.web.dependencies import (
    CurrentTenant,
    ExecutionServiceDep,
    SessionContextDep,
    SessionServiceDep,
)
from sandpod_gateway.web.errors import error_responses, responses_with
from sandpod_gateway.web.security_headers import attachment_response

router = APIRouter(
    prefix="/v1/sessions", tags=["sessions"], responses=error_responses(*COMMON_ERRORS)
)


FilePath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=255,
        pattern=RELATIVE_PATH_PATTERN,
        description="Relative path in the session's work directory, e.g. data/input.csv",
    ),
    TrustedName,
]


@router.post(
    "",
    response_model=SessionInfo,
    status_code=201,
    summary="Open a session",
    description="Creates a session: one sandbox kept for this caller until it is closed, "
    "idle for idle_timeout_seconds, or max_lifetime_seconds old. Answers 201 at once "
    "(status starting); runs sent meanwhile wait for it. A retry with the same "
    "Idempotency-Key answers 200 with the same session.",
    responses=responses_with(
        200, SessionInfo, "The session an earlier retry opened", 400, 409, 429
    ),
)
async def post_session(
    body: CreateSessionRequest,
    response: Response,
    ctx: SessionContextDep,
    idempotency_key: IdempotencyKey = None,
) -> SessionInfo:
    outcome = await open_session(body, ctx, idempotency_key)
    response.status_code = 201 if outcome.created else 200
    response.headers["Location"] = f"{router.prefix}/{outcome.session.id}"
    return outcome.session


@router.get("", response_model=SessionPage, summary="List sessions", responses=error_responses(400))
async def list_sessions(
    tenant: CurrentTenant, sessions: SessionServiceDep, page: PageParams
) -> SessionPage:
    return SessionPage.of(await list_page(sessions.list, tenant, page), session_info)


async def owned_session(session_id: str, ctx: SessionContextDep) -> Resource:
    return await get_owned_session(session_id, ctx.tenant, ctx.sessions)


@router.get(
    "/{session_id}",
    response_model=SessionInfo,
    summary="Get a session",
    responses=error_responses(404),
)
async def get_session(session: Annotated[Resource, Depends(owned_session)]) -> SessionInfo:
    return session_info(session)


@router.delete(
    "/{session_id}",
    response_model=SessionInfo,
    summary="Close a session",
    description="Ends the session and deletes its sandbox (202, the session as it was); a "
    "session that has ended already is returned as it is (200). Afterwards it is 404.",
    responses=responses_with(202, SessionInfo, "Closing", 404),
)
async def delete_session(
    session_id: str, response: Response, ctx: SessionContextDep
) -> SessionInfo:
    info, closing = await close_session(session_id, ctx)
    response.status_code = 202 if closing else 200
    return info


@router.post(
    "/{session_id}/executions",
    response_model=ExecutionResult,
    summary="Run code in a session",
    description="As POST /v1/executions, in the session's sandbox after its earlier runs: "
    "files, installed packages and (Python, JavaScript, TypeScript) variables persist. "
    "language is optional (the session's); memory and cpu are the session's. The result "
    "adds `result` (a trailing expression's value as text) and `state_lost`.",
    responses=responses_with(
        202, ExecutionResult, "Accepted; not finished yet", 400, 404, 409, 413, 429
    ),
)
async def post_session_execution(
    session_id: str, body: SessionExecutionRequest, ctx: SessionContextDep, call: CreateCallDep
) -> ExecutionResult:
    outcome = await run_in_session(
        session_id, body, ctx, idempotency_key=call.idempotency_key, wait=call.wait
    )
    return call.answer(outcome)


@router.post(
    "/{session_id}/commands",
    response_model=ExecutionResult,
    summary="Run a shell command in a session",
    description="Runs `command` with `/bin/bash -lc` in the session's sandbox, beside its "
    "interpreter (Python and bash sessions): with the session's files, installed packages and "
    "limits, in turn with its runs (a run of the session, so GET /v1/executions/{id} has it). "
    "The answer is the run's result with the command's exit status as `exit_code` (`success` "
    "when 0, else `error`); a timeout or cancel is as for any run. Another language's session "
    "is 422 `commands_unsupported`.",
    responses=error_responses(400, 404, 409, 413, 422, 429),
)
async def post_session_command(
    session_id: str,
    body: SessionCommandRequest,
    ctx: SessionContextDep,
    idempotency_key: IdempotencyKey = None,
) -> ExecutionResult:
    language, result = await run_command(
        session_id,
        [*SHELL, body.command],
        cwd=body.cwd,
        env=body.env,
        ctx=ctx,
        timeout_seconds=body.timeout_seconds,
        idempotency_key=idempotency_key,
    )
    return command_result(language, result)


@dataclass(frozen=True)
class StartedRun:
    """A run in a session that has written output, or ended (a refusal is raised before
    the answer starts)."""

    live: LiveOutput
    running: "asyncio.Future[CreateOutcome]"


async def started_run(
    session_id: str,
    body: SessionExecutionRequest,
    ctx: SessionContextDep,
    idempotency_key: IdempotencyKey = None,
) -> StartedRun:
    live = LiveOutput()
    running = asyncio.ensure_future(
        run_in_session(
            session_id, body, ctx, idempotency_key=idempotency_key, wait=True, on_output=live.put
        )
    )
    if not await live.started(running):
        running.result()
    return StartedRun(live, running)


@router.post(
    "/{session_id}/executions/stream",
    response_class=EventSourceResponse,
    summary="Run code in a session, streaming its output",
    description="As POST /{session_id}/executions (it waits), answered as Server-Sent Events: "
    "`stdout` and `stderr` chunks as the program writes them (unverified until the run has "
    "ended, like every live stream), then `exit` with the result; `error` "
    '({"code", "message"}) if the run cannot be completed. A refusal (404, 409, 422, 429) '
    "is an error answer before the stream starts.",
    responses=error_responses(*COMMON_ERRORS, 400, 404, 409, 413, 429, streaming=True),
)
async def post_session_execution_stream(
    run: Annotated[StartedRun, Depends(started_run)],
) -> AsyncIterator[ServerSentEvent]:
    async for event in live_events(run.live, run.running):
        yield event


async def session_execution(
    session_id: str, execution_id: str, tenant: CurrentTenant, executions: ExecutionServiceDep
) -> Resource:
    """The tenant's execution in that session; 404 for anything else."""
    execution = await get_owned_execution(execution_id, tenant, executions)
    if (execution.get("spec") or {}).get("session") != session_id:
        raise ExecutionNotFound(execution_id)
    return execution


async def session_stream_slot(
    execution: Annotated[Resource, Depends(session_execution)], ctx: SessionContextDep
) -> AsyncIterator[None]:
    """A wait slot held until the stream has ended (429 before it starts, if none is left)."""
    name = execution["metadata"]["name"]
    with ctx.admission.waiting(ctx.tenant, name, ctx.settings, follows_log=True):
        yield


@router.get(
    "/{session_id}/executions/{execution_id}/stream",
    response_class=EventSourceResponse,
    summary="Stream a run's output",
    description="As GET /v1/executions/{id}/stream. A run in a session shares its pod's log "
    "with the session's other runs, so its output comes once it has finished, then `exit`.",
    responses=error_responses(*COMMON_ERRORS, 404, streaming=True),
)
async def stream_session_execution(
    execution: Annotated[Resource, Depends(session_execution)],
    _slot: Annotated[None, Depends(session_stream_slot)],
    ctx: SessionContextDep,
) -> AsyncIterator[ServerSentEvent]:
    async for event in execution_events(
        execution, ctx.tenant.namespace, ctx.executions, ctx.settings
    ):
        yield event


@router.put(
    "/{session_id}/files/{path:path}",
    response_model=FileInfo,
    summary="Upload a file",
    description="Writes the request body (UTF-8 text, at most the tenant's maxFileBytes) to "
    "the path in the session's work directory, as a run in the session (after its earlier "
    "runs).",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
    responses=error_responses(400, 404, 409, 413, 415, 429),
)
async def put_file(
    session_id: str, path: FilePath, request: Request, ctx: SessionContextDep
) -> FileInfo:
    return await upload_file(session_id, path, await request.body(), ctx)


@router.get(
    "/{session_id}/files/{path:path}",
    response_class=Response,
    summary="Download a file",
    description="The file's bytes, read by a run in the session (after its earlier runs); "
    "served as an attachment, never rendered.",
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}},
        **error_responses(400, 404, 409, 413, 429),
    },
)
async def get_file(session_id: str, path: FilePath, ctx: SessionContextDep) -> Response:
    data = await download_file(session_id, path, ctx)
    return attachment_response(data, "application/octet-stream", path)
