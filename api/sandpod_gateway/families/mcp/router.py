"""/mcp: the MCP endpoint (streamable HTTP), behind the same API keys as /v1."""

from fastapi import APIRouter, Request, Response
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from sandpod_gateway.families.mcp.mcp_server import TOOL_CALL_STATE, ToolCallContext
from sandpod_gateway.web.dependencies import MetricsDep, SessionContextDep

router = APIRouter(tags=["mcp"])


class McpTransportResponse(Response):
    """Hands the whole exchange (body, answer, stream) to the MCP session manager."""

    def __init__(self, sessions: StreamableHTTPSessionManager) -> None:
        super().__init__()
        self._sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._sessions.handle_request(scope, receive, send)


@router.api_route("/mcp", methods=["GET", "POST", "DELETE"], include_in_schema=False)
async def mcp_endpoint(
    request: Request, context: SessionContextDep, metrics: MetricsDep
) -> Response:
    setattr(request.state, TOOL_CALL_STATE, ToolCallContext(context=context, metrics=metrics))
    manager: StreamableHTTPSessionManager = request.app.state.mcp_sessions
    return McpTransportResponse(manager)
