"""The tools as OpenAI function tools: each definition's arguments as a JSON schema, its
maximums bounded by the tenant's."""

from typing import Any

from pydantic import BaseModel

from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.policy.auth import TenantLimits
from sandpod_gateway.usecases.tool_definitions import TOOLS, ToolDefinition


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """A property schema without pydantic's title and Optional wrapper (absent means unset)."""
    variants = [v for v in schema.get("anyOf", []) if v.get("type") != "null"]
    rest = {k: v for k, v in schema.items() if k not in ("anyOf", "title", "default")}
    return {**variants[0], **rest} if variants else rest


def tool_parameters(
    tool: ToolDefinition, catalog: LanguageCatalog, limits: TenantLimits
) -> dict[str, Any]:
    """JSON schema of the tool's arguments, with the maximums bounded by the tenant's."""
    schema = tool.arguments_model(catalog).model_json_schema()
    properties = {name: _plain(value) for name, value in schema["properties"].items()}
    for argument in tool.arguments(catalog):
        if argument.tenant_maximum is not None:
            bounded = properties[argument.name]
            bounded["maximum"] = min(getattr(limits, argument.tenant_maximum), bounded["maximum"])
    return {
        "type": "object",
        "properties": properties,
        "required": schema.get("required", []),
        "additionalProperties": False,
    }


class OpenAIFunction(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class OpenAITool(BaseModel):
    type: str = "function"
    function: OpenAIFunction


def openai_tools(catalog: LanguageCatalog, limits: TenantLimits) -> list[OpenAITool]:
    return [
        OpenAITool(
            function=OpenAIFunction(
                name=tool.name,
                description=tool.description,
                parameters=tool_parameters(tool, catalog, limits),
            )
        )
        for tool in TOOLS
    ]
