"""/v1/executions: create (and wait), get, list, cancel, stream."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from sandpod_gateway.kube.resources import Resource, execution_result, is_terminal
from sandpod_gateway.schemas import (
    CreateExecutionRequest,
    ExecutionPage,
    ExecutionResult,
)
from sandpod_gateway.usecases.executions import (
    create_execution,
    get_owned_execution,
    list_page,
    read_output_file,
    result_with_files,
)
from sandpod_gateway.usecases.streaming import execution_events
from sandpod_gateway.web.common import COMMON_ERRORS, EXECUTIONS_PATH, CreateCallDep, PageParams
from sandpod_gateway.web.dependencies import (
    AdmissionDep,
    CurrentTenant,
    ExecutionContextDep,
    ExecutionServiceDep,
    SettingsDep,
)
from sandpod_gateway.web.errors import error_responses, responses_with
from sandpod_gateway.web.security_headers import attachment_response

router = APIRouter(
    prefix=EXECUTIONS_PATH, tags=["executions"], responses=error_responses(*COMMON_ERRORS)
)


async def owned_execution(
    execution_id: str, tenant: CurrentTenant, service: ExecutionServiceDep
) -> Resource:
    return await get_owned_execution(execution_id, tenant, service)


OwnedExecution = Annotated[Resource, Depends(owned_execution)]


async def stream_slot(
    execution: OwnedExecution, tenant: CurrentTenant, admission: AdmissionDep, settings: SettingsDep
) -> AsyncIterator[None]:
    """One of the tenant's wait slots, held until the stream has ended (429 if none is left,
    before the stream starts)."""
    with admission.waiting(tenant, execution["metadata"]["name"], settings, follows_log=True):
        yield


StreamSlot = Annotated[None, Depends(stream_slot)]


@router.post(
    "",
    response_model=ExecutionResult,
    summary="Run code",
    description="Creates an execution. With wait=true (default) answers 200 with the result "
    "once it has finished; with wait=false, or if it is still running when the wait ends, "
    "answers 202 with its current state.",
    responses=responses_with(
        202, ExecutionResult, "Accepted; not finished yet", 400, 409, 413, 429
    ),
)
async def post_execution(
    body: CreateExecutionRequest, ctx: ExecutionContextDep, call: CreateCallDep
) -> ExecutionResult:
    outcome = await create_execution(
        body, ctx, idempotency_key=call.idempotency_key, wait=call.wait
    )
    return call.answer(outcome)


@router.get(
    "", response_model=ExecutionPage, summary="List executions", responses=error_responses(400)
)
async def list_executions(
    tenant: CurrentTenant, service: ExecutionServiceDep, page: PageParams
) -> ExecutionPage:
    return ExecutionPage.of(await list_page(service.list, tenant, page), execution_result)


@router.get(
    "/{execution_id}",
    response_model=ExecutionResult,
    summary="Get an execution",
    responses=error_responses(404),
)
async def get_execution(
    execution: OwnedExecution, tenant: CurrentTenant, service: ExecutionServiceDep
) -> ExecutionResult:
    return await result_with_files(execution, tenant, service)


@router.get(
    "/{execution_id}/files/{path:path}",
    response_class=Response,
    summary="Get an output file",
    description="The bytes of a file the program left in /tmp/outputs, with its media type "
    "(served as an attachment, never rendered). 404 for a path the execution does not "
    "have, or whose content was not stored.",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file"},
        **error_responses(404),
    },
)
async def get_output_file(
    execution: OwnedExecution, path: str, tenant: CurrentTenant, service: ExecutionServiceDep
) -> Response:
    content, media_type = await read_output_file(execution, path, tenant, service)
    return attachment_response(content, media_type, path)


@router.delete(
    "/{execution_id}",
    response_model=ExecutionResult,
    summary="Cancel an execution",
    description="Asks for the execution to be stopped (202); the result turns to cancelled "
    "shortly. An execution that has finished already is returned as it is (200).",
    responses=responses_with(202, ExecutionResult, "Cancel requested", 404),
)
async def cancel_execution(
    execution: OwnedExecution,
    response: Response,
    tenant: CurrentTenant,
    service: ExecutionServiceDep,
) -> ExecutionResult:
    if is_terminal(execution):
        return execution_result(execution)
    execution = await service.cancel(tenant.namespace, execution["metadata"]["name"])
    response.status_code = 202
    return execution_result(execution)


@router.get(
    "/{execution_id}/stream",
    response_class=EventSourceResponse,
    summary="Stream output",
    description='Server-Sent Events: `stdout` and `stderr` ({"data": text}) as the program '
    "writes, then `exit` with the result (an ExecutionResult). `error` "
    '({"code", "message"}) if the stream cannot continue.',
    responses=error_responses(*COMMON_ERRORS, 404, streaming=True),
)
async def stream_execution(
    execution: OwnedExecution,
    _slot: StreamSlot,
    tenant: CurrentTenant,
    service: ExecutionServiceDep,
    settings: SettingsDep,
) -> AsyncIterator[ServerSentEvent]:
    async for event in execution_events(execution, tenant.namespace, service, settings):
        yield event
