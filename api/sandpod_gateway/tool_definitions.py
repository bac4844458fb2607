"""The run_code tool as agents see it: one definition of its arguments, from which both the
MCP tool and the OpenAI function tool are derived."""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from sandpod_contract.models import MAX_TIMEOUT_SECONDS

from sandpod_gateway.languages import LanguageCatalog

RUN_CODE_NAME = "run_code"
RUN_CODE_DESCRIPTION = (
    "Run a program in a fresh, isolated sandbox (no network, no state kept between runs) "
    "and return its stdout, stderr and exit code. Print whatever you want to see. "
    "status is success, error (non-zero exit; read stderr), compile_error (the program did "
    "not build; read compile_output), timeout, cancelled or sandbox_error (the sandbox itself "
    "failed; error_message says why)."
)

Code = Annotated[str, Field(min_length=1, description="The complete program to run")]
# The CRD's maximum; a tenant's own maximum is lower or equal (checked at admission).
TimeoutSeconds = Annotated[
    int | None,
    Field(ge=1, le=MAX_TIMEOUT_SECONDS, description="Wall-clock limit in seconds (optional)"),
]


def language_field(catalog: LanguageCatalog) -> FieldInfo:
    """The `language` argument: one of the catalog's languages."""
    languages = catalog.all()
    field: FieldInfo = Field(
        description="Programming language: "
        + "; ".join(f"{language.name} ({language.version or 'current'})" for language in languages),
        json_schema_extra={"enum": [language.name for language in languages]},
    )
    return field


def run_code_arguments(catalog: LanguageCatalog) -> type[BaseModel]:
    """run_code's arguments as a model (the MCP tool's signature uses the same fields)."""
    return create_model(
        "RunCodeArguments",
        __config__=ConfigDict(extra="forbid"),
        language=(Annotated[str, language_field(catalog)], ...),
        code=(Code, ...),
        timeout_seconds=(TimeoutSeconds, None),
    )


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """A property schema without pydantic's title and Optional wrapper (absent means unset)."""
    variants = [v for v in schema.get("anyOf", []) if v.get("type") != "null"]
    rest = {k: v for k, v in schema.items() if k not in ("anyOf", "title", "default")}
    return {**variants[0], **rest} if variants else rest


def run_code_parameters(catalog: LanguageCatalog, max_timeout_seconds: int) -> dict[str, Any]:
    """JSON schema of run_code's arguments, with the timeout bounded by `max_timeout_seconds`."""
    schema = run_code_arguments(catalog).model_json_schema()
    properties = {name: _plain(value) for name, value in schema["properties"].items()}
    timeout = properties["timeout_seconds"]
    timeout["maximum"] = min(max_timeout_seconds, timeout["maximum"])
    return {
        "type": "object",
        "properties": properties,
        "required": schema["required"],
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
