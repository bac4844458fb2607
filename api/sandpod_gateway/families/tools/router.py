"""/v1/tools: ready-made tool definitions for agent frameworks."""

from fastapi import APIRouter

from sandpod_gateway.families.tools.openai_tools import OpenAITool, openai_tools
from sandpod_gateway.web.dependencies import CatalogDep, CurrentTenant
from sandpod_gateway.web.errors import error_responses

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=error_responses(401, 429, 503))


@router.get(
    "/openai",
    response_model=list[OpenAITool],
    summary="The tools as OpenAI function tools",
    description="run_code, open_session, run_in_session and close_session; put this list in "
    "`tools` of a chat completion and answer each call the model makes with POST "
    "/v1/executions, POST /v1/sessions, POST /v1/sessions/{session_id}/executions or DELETE "
    "/v1/sessions/{session_id}. Maximums (timeout, idle timeout) are the tenant's.",
)
async def get_openai_tools(tenant: CurrentTenant, catalog: CatalogDep) -> list[OpenAITool]:
    return openai_tools(catalog, tenant.limits)
