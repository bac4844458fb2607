"""An MCP server (streamable HTTP, served at /mcp) with the tools of tool_definitions:
run_code, open_session, run_in_session, run_command, close_session.

The /mcp route authenticates the caller like every other route and puts what the
tool needs into the request state; the tool reads it from the MCP request context.
"""

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import BaseModel, ValidationError

from sandpod_gateway.kube.service import (
    ExecutionNotFound,
    KubernetesUnavailable,
    SessionNotFound,
)
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.schemas import (
    CreateExecutionRequest,
    CreateSessionRequest,
    ExecutionResult,
    SessionExecutionRequest,
    SessionInfo,
)
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.executions import CreateOutcome, create_execution
from sandpod_gateway.usecases.session_commands import SHELL, command_result, run_command
from sandpod_gateway.usecases.sessions import (
    SessionContext,
    close_session,
    open_session,
    run_in_session,
)
from sandpod_gateway.usecases.tool_definitions import (
    CLOSE_SESSION,
    OPEN_SESSION,
    RUN_CODE,
    RUN_COMMAND,
    RUN_IN_SESSION,
    TOOLS,
    ToolDefinition,
)
from sandpod_gateway.web.errors import GatewayError, as_gateway_error
from sandpod_gateway.web.metrics import GatewayMetrics

TOOL_CALL_STATE = "sandpod_tool_call"


@dataclass(frozen=True)
class ToolCallContext:
    """Everything a tool call needs, resolved by the /mcp route for this request."""

    context: SessionContext
    metrics: GatewayMetrics

    def count(self, outcome: CreateOutcome) -> ExecutionResult:
        if outcome.created:
            self.metrics.executions.labels(outcome.result.language, outcome.result.status).inc()
        return outcome.result


Handler = Callable[[Any, ToolCallContext], Awaitable[BaseModel]]


def _tool_call_context(ctx: Context[Any, Any]) -> ToolCallContext:
    request = ctx.request_context.request
    call = getattr(getattr(request, "state", None), TOOL_CALL_STATE, None)
    if not isinstance(call, ToolCallContext):
        raise ToolError("sandpod tools are only served over the gateway's authenticated /mcp")
    return call


async def run_code(arguments: Any, call: ToolCallContext) -> ExecutionResult:
    request = CreateExecutionRequest(
        language=arguments.language,
        code=arguments.code,
        timeout_seconds=arguments.timeout_seconds,
        allow_hosts=arguments.allow_hosts,
        mode=arguments.mode or "run",
    )
    outcome = await create_execution(request, call.context, idempotency_key=None, wait=True)
    return call.count(outcome)


async def open_session_tool(arguments: Any, call: ToolCallContext) -> SessionInfo:
    request = CreateSessionRequest(
        language=arguments.language,
        idle_timeout_seconds=arguments.idle_timeout_seconds,
        allow_hosts=arguments.allow_hosts,
    )
    return (await open_session(request, call.context, None)).session


async def run_in_session_tool(arguments: Any, call: ToolCallContext) -> ExecutionResult:
    body = SessionExecutionRequest(
        code=arguments.code, timeout_seconds=arguments.timeout_seconds, mode=arguments.mode or "run"
    )
    outcome = await run_in_session(
        arguments.session_id, body, call.context, idempotency_key=None, wait=True
    )
    return call.count(outcome)


async def run_command_tool(arguments: Any, call: ToolCallContext) -> ExecutionResult:
    language, result = await run_command(
        arguments.session_id,
        [*SHELL, arguments.command],
        cwd=None,
        env={},
        ctx=call.context,
        timeout_seconds=arguments.timeout_seconds,
    )
    return command_result(language, result)


async def close_session_tool(arguments: Any, call: ToolCallContext) -> SessionInfo:
    info, _ = await close_session(arguments.session_id, call.context)
    return info


HANDLERS: dict[str, tuple[Handler, type[BaseModel]]] = {
    RUN_CODE.name: (run_code, ExecutionResult),
    OPEN_SESSION.name: (open_session_tool, SessionInfo),
    RUN_IN_SESSION.name: (run_in_session_tool, ExecutionResult),
    RUN_COMMAND.name: (run_command_tool, ExecutionResult),
    CLOSE_SESSION.name: (close_session_tool, SessionInfo),
}


def _tool_function(
    definition: ToolDefinition, catalog: LanguageCatalog, handler: Handler, result: type
) -> Callable[..., Awaitable[Any]]:
    """An MCP tool function whose signature is the definition's arguments (plus the MCP
    context), so the MCP schema and the OpenAI one come from the same definition."""
    model = definition.arguments_model(catalog)

    async def tool(ctx: Context[Any, Any], **arguments: Any) -> Any:
        call = _tool_call_context(ctx)
        try:
            return await handler(model.model_validate(arguments), call)
        except ValidationError as exc:
            raise ToolError(f"invalid arguments: {exc}") from exc
        except (GatewayError, KubernetesUnavailable, SessionNotFound, ExecutionNotFound) as exc:
            error = as_gateway_error(exc, call.context.settings.default_retry_after_seconds)
            assert error is not None
            raise ToolError(f"{error.code}: {error.message}") from exc

    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    parameters = [*definition.signature(catalog), context]
    tool.__dict__["__signature__"] = inspect.Signature(parameters, return_annotation=result)
    tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": result}
    return tool


def build_mcp_server(catalog: LanguageCatalog) -> MCPServer:
    server: MCPServer = MCPServer(
        "sandpod",
        instructions="Run code in isolated sandboxes: run_code for one-off programs; "
        "open_session, run_in_session and close_session to keep state between runs; "
        "run_command for a shell command beside a session's interpreter.",
    )
    for definition in TOOLS:
        handler, result = HANDLERS[definition.name]
        server.add_tool(
            _tool_function(definition, catalog, handler, result),
            name=definition.name,
            description=definition.description,
            annotations=ToolAnnotations(
                title=definition.title,
                read_only_hint=False,
                destructive_hint=definition.destructive,
                idempotent_hint=definition.idempotent,
                open_world_hint=definition.open_world,
            ),
        )
    return server


def new_session_manager(
    server: MCPServer, settings: GatewaySettings
) -> StreamableHTTPSessionManager:
    """A fresh session manager for one run of the app (a manager runs only once).

    Stateless, JSON answers: each POST carries one complete exchange, so any replica
    can serve any request.
    """
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        max_request_body_size=settings.max_request_bytes,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=bool(settings.mcp_allowed_hosts),
            allowed_hosts=settings.mcp_allowed_hosts,
        ),
    )
    return server.session_manager
