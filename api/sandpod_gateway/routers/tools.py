"""/v1/tools: ready-made tool definitions for agent frameworks."""

from fastapi import APIRouter

from sandpod_gateway.dependencies import CatalogDep, CurrentTenant
from sandpod_gateway.errors import error_responses
from sandpod_gateway.tool_definitions import OpenAITool, openai_tool

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=error_responses(401, 503))


@router.get(
    "/openai",
    response_model=OpenAITool,
    summary="run_code as an OpenAI function tool",
    description="Put this in `tools` of a chat completion; call POST /v1/executions "
    "with the arguments the model returns. The timeout maximum is the tenant's.",
)
async def get_openai_tool(tenant: CurrentTenant, catalog: CatalogDep) -> OpenAITool:
    return openai_tool(catalog, tenant.limits.max_timeout_seconds)
