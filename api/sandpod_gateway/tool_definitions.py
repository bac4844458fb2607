"""The run_code tool as agents see it (OpenAI function tools, MCP)."""

from typing import Any

from pydantic import BaseModel

from sandpod_gateway.languages import LanguageCatalog

RUN_CODE_NAME = "run_code"
RUN_CODE_DESCRIPTION = (
    "Run a program in a fresh, isolated sandbox (no network, no state kept between runs) "
    "and return its stdout, stderr and exit code. Print whatever you want to see. "
    "status is success, error (non-zero exit; read stderr), timeout, cancelled or "
    "sandbox_error (the sandbox itself failed; error_message says why)."
)


def run_code_parameters(catalog: LanguageCatalog, max_timeout_seconds: int) -> dict[str, Any]:
    """JSON schema of run_code's arguments."""
    languages = catalog.all()
    return {
        "type": "object",
        "properties": {
            "language": {
                "type": "string",
                "enum": [language.name for language in languages],
                "description": "Programming language: "
                + "; ".join(
                    f"{language.name} ({language.version or 'current'})" for language in languages
                ),
            },
            "code": {"type": "string", "description": "The complete program to run"},
            "timeout_seconds": {
                "type": "integer",
                "minimum": 1,
                "maximum": max_timeout_seconds,
                "description": "Wall-clock limit in seconds (optional)",
            },
        },
        "required": ["language", "code"],
        "additionalProperties": False,
    }


class OpenAIFunction(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class OpenAITool(BaseModel):
    type: str = "function"
    function: OpenAIFunction


def openai_tool(catalog: LanguageCatalog, max_timeout_seconds: int) -> OpenAITool:
    return OpenAITool(
        function=OpenAIFunction(
            name=RUN_CODE_NAME,
            description=RUN_CODE_DESCRIPTION,
            parameters=run_code_parameters(catalog, max_timeout_seconds),
        )
    )
