"""An MCP server (streamable HTTP, served at /mcp) with one tool: run_code.

The /mcp route authenticates the caller like every other route and puts what the
tool needs into the request state; the tool reads it from the MCP request context.
"""

from dataclasses import dataclass
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import ValidationError

from sandpod_gateway.admission import AdmissionControl
from sandpod_gateway.auth import Tenant
from sandpod_gateway.errors import GatewayError, as_gateway_error
from sandpod_gateway.executions import create_execution
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.metrics import GatewayMetrics
from sandpod_gateway.schemas import CreateExecutionRequest, ExecutionResult
from sandpod_gateway.service import ExecutionService, KubernetesUnavailable
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.tool_definitions import (
    RUN_CODE_DESCRIPTION,
    RUN_CODE_NAME,
    Code,
    TimeoutSeconds,
    language_field,
)

TOOL_CALL_STATE = "sandpod_tool_call"


@dataclass(frozen=True)
class ToolCallContext:
    """Everything a tool call needs, resolved by the /mcp route for this request."""

    tenant: Tenant
    service: ExecutionService
    catalog: LanguageCatalog
    settings: GatewaySettings
    admission: AdmissionControl
    metrics: GatewayMetrics


def _tool_call_context(ctx: Context[Any, Any]) -> ToolCallContext:
    request = ctx.request_context.request
    call = getattr(getattr(request, "state", None), TOOL_CALL_STATE, None)
    if not isinstance(call, ToolCallContext):
        raise ToolError("run_code is only served over the gateway's authenticated /mcp endpoint")
    return call


def build_mcp_server(catalog: LanguageCatalog) -> MCPServer:
    server: MCPServer = MCPServer(
        "sandpod",
        instructions="Run code in isolated sandboxes with the run_code tool.",
    )

    # The arguments of tool_definitions.run_code_arguments, field for field.
    async def run_code(
        language: Annotated[str, language_field(catalog)],
        code: Code,
        ctx: Context[Any, Any],
        timeout_seconds: TimeoutSeconds = None,
    ) -> ExecutionResult:
        call = _tool_call_context(ctx)
        try:
            request = CreateExecutionRequest(
                language=language, code=code, timeout_seconds=timeout_seconds
            )
            outcome = await create_execution(
                request,
                tenant=call.tenant,
                service=call.service,
                catalog=call.catalog,
                settings=call.settings,
                admission=call.admission,
                idempotency_key=None,
                wait=True,
            )
        except ValidationError as exc:
            raise ToolError(f"invalid arguments: {exc}") from exc
        except (GatewayError, KubernetesUnavailable) as exc:
            error = as_gateway_error(exc, call.settings.default_retry_after_seconds)
            assert error is not None
            raise ToolError(f"{error.code}: {error.message}") from exc
        if outcome.created:
            call.metrics.executions.labels(outcome.result.language, outcome.result.status).inc()
        return outcome.result

    server.add_tool(
        run_code,
        name=RUN_CODE_NAME,
        description=RUN_CODE_DESCRIPTION,
        annotations=ToolAnnotations(
            title="Run code in a sandbox",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
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
