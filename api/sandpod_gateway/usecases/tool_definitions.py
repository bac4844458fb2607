"""The tools agents see (run_code, open_session, run_in_session, run_command,
close_session): one definition each, from which both the MCP tool and the OpenAI function
tool are derived."""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from sandpod_contract.models import (
    MAX_NAME_LENGTH,
    MAX_SESSION_SECONDS,
    MAX_TIMEOUT_SECONDS,
    MIN_IDLE_TIMEOUT_SECONDS,
    MIN_TIMEOUT_SECONDS,
)

from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.schemas import AllowHosts, Mode

RUN_CODE_NAME = "run_code"
RUN_CODE_DESCRIPTION = (
    "Run a program in a fresh, isolated sandbox (no state kept between runs; no network "
    "unless allow_hosts names hosts, and only those the platform allows) and return its "
    "stdout, stderr and exit code; in Python also `result`, the repr of the last line's "
    "value when it is an expression. Print whatever else you want to see. "
    "mode lint checks the code for errors instead (structured `diagnostics`). "
    "status is success, error (non-zero exit; read stderr: for an uncaught Python "
    "exception error_message quotes its last line), compile_error (the program did "
    "not build; read compile_output), timeout, cancelled or sandbox_error (the sandbox "
    "itself failed; error_message says why, e.g. InvalidSpec for a host not allowed). "
    "egress_blocked lists requests the proxy refused (host, port, count). To keep variables "
    "and files between runs, use open_session and run_in_session instead."
)
OPEN_SESSION_DESCRIPTION = (
    "Open a session: one isolated sandbox kept for you, where runs share files, installed "
    "packages and, in Python, JavaScript and TypeScript, variables, imports and functions, "
    "like a notebook. No network "
    "unless allow_hosts names hosts (e.g. pypi.org and files.pythonhosted.org to pip "
    "install), and only those the platform allows: another ends the session (status ended, "
    "reason InvalidSpec). "
    "Returns the session's id for run_in_session. It ends after idle_timeout_seconds "
    "without runs; close it with close_session when done."
)
RUN_IN_SESSION_DESCRIPTION = (
    "Run code in an open session, after its earlier runs: what they defined is still there. "
    "Returns stdout, stderr, exit code and, in Python, JavaScript and TypeScript, `result`: "
    "the last line's value when it is an expression (Python's repr, Node's util.inspect). "
    "state_lost true means the interpreter was restarted (a timeout or crash) and earlier "
    "variables are gone; files remain. "
    "reported_by sessionKernel means the session's interpreter reported the result: code "
    "run earlier in the same session can change what later runs report. mode lint checks "
    "the code for errors instead, beside the session (its state is not used or changed)."
)
RUN_COMMAND_DESCRIPTION = (
    "Run a shell command (bash) in an open Python or bash session's sandbox, beside its "
    "interpreter: it sees the session's files and installed packages (e.g. `ls`, `pip list`, "
    "`git diff`). Returns stdout, stderr and the command's exit status as exit_code (status "
    "success when 0, else error). No network unless the session allows hosts."
)
CLOSE_SESSION_DESCRIPTION = (
    "Close a session: its sandbox and everything in it are deleted. Returns the session."
)

Code = Annotated[str, Field(min_length=1, description="The complete program to run")]
ToolMode = Annotated[
    Mode | None,
    Field(
        description="run (default), or lint: check the code for errors instead of running "
        "it (python: ruff with nearly all its rules); the answer's `diagnostics` then list "
        "each finding as code, message and location {line, column}, and nothing runs",
    ),
]
SessionCode = Annotated[
    str,
    Field(
        min_length=1,
        description="Code to run in the session (Python, JavaScript, TypeScript: its last "
        "line's value, if an expression, comes back as `result`)",
    ),
]
# The CRD's maximum; a tenant's own maximum is lower or equal (checked at admission).
TimeoutSeconds = Annotated[
    int | None,
    Field(
        ge=MIN_TIMEOUT_SECONDS,
        le=MAX_TIMEOUT_SECONDS,
        description="Wall-clock limit in seconds (optional)",
    ),
]
IdleTimeoutSeconds = Annotated[
    int | None,
    Field(
        ge=MIN_IDLE_TIMEOUT_SECONDS,
        le=MAX_SESSION_SECONDS,
        description="End the session after this many seconds without runs (optional)",
    ),
]
Command = Annotated[
    str, Field(min_length=1, description="The command line, run by `/bin/bash -lc`")
]
SessionId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_LENGTH, description="The id open_session returned"),
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


@dataclass(frozen=True)
class Argument:
    """One argument: its name and annotated type; optional ones default to None."""

    name: str
    annotation: Any
    required: bool = True
    # The TenantLimits field that bounds it in a tenant's OpenAI definition.
    tenant_maximum: str | None = None


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    title: str
    description: str
    arguments: Callable[[LanguageCatalog], tuple[Argument, ...]]
    destructive: bool = False
    idempotent: bool = False
    # May reach hosts outside the platform (the ones allow_hosts names, when allowed).
    open_world: bool = False

    def arguments_model(self, catalog: LanguageCatalog) -> type[BaseModel]:
        fields: dict[str, Any] = {
            argument.name: (argument.annotation, ... if argument.required else None)
            for argument in self.arguments(catalog)
        }
        model_name = "".join(part.title() for part in self.name.split("_")) + "Arguments"
        return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)

    def signature(self, catalog: LanguageCatalog) -> list[inspect.Parameter]:
        """The arguments as keyword parameters (the MCP tool function's signature)."""
        return [
            inspect.Parameter(
                argument.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=argument.annotation,
                default=inspect.Parameter.empty if argument.required else None,
            )
            for argument in self.arguments(catalog)
        ]


def _language(catalog: LanguageCatalog) -> Argument:
    return Argument("language", Annotated[str, language_field(catalog)])


TIMEOUT = Argument(
    "timeout_seconds", TimeoutSeconds, required=False, tenant_maximum="max_timeout_seconds"
)
IDLE_TIMEOUT = Argument(
    "idle_timeout_seconds",
    IdleTimeoutSeconds,
    required=False,
    tenant_maximum="max_idle_timeout_seconds",
)
SESSION_ID = Argument("session_id", SessionId)
MODE = Argument("mode", ToolMode, required=False)
ALLOW_HOSTS = Argument("allow_hosts", AllowHosts, required=False)

RUN_CODE = ToolDefinition(
    name=RUN_CODE_NAME,
    title="Run code in a sandbox",
    description=RUN_CODE_DESCRIPTION,
    arguments=lambda catalog: (
        _language(catalog),
        Argument("code", Code),
        TIMEOUT,
        ALLOW_HOSTS,
        MODE,
    ),
    open_world=True,
)
OPEN_SESSION = ToolDefinition(
    name="open_session",
    title="Open a sandbox session",
    description=OPEN_SESSION_DESCRIPTION,
    arguments=lambda catalog: (_language(catalog), IDLE_TIMEOUT, ALLOW_HOSTS),
    open_world=True,
)
RUN_IN_SESSION = ToolDefinition(
    name="run_in_session",
    title="Run code in a session",
    description=RUN_IN_SESSION_DESCRIPTION,
    arguments=lambda _catalog: (SESSION_ID, Argument("code", SessionCode), TIMEOUT, MODE),
    open_world=True,
)
RUN_COMMAND = ToolDefinition(
    name="run_command",
    title="Run a shell command in a session",
    description=RUN_COMMAND_DESCRIPTION,
    arguments=lambda _catalog: (SESSION_ID, Argument("command", Command), TIMEOUT),
    open_world=True,
)
CLOSE_SESSION = ToolDefinition(
    name="close_session",
    title="Close a sandbox session",
    description=CLOSE_SESSION_DESCRIPTION,
    arguments=lambda _catalog: (SESSION_ID,),
    destructive=True,
    idempotent=True,
)
TOOLS = (RUN_CODE, OPEN_SESSION, RUN_IN_SESSION, RUN_COMMAND, CLOSE_SESSION)
