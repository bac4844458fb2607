"""The gateway's HTTP shapes (snake_case, agent-facing). Bounds come from the
CodeExecution models, so a request that passes here also passes the CRD."""

from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Generic, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError
from sandpod_contract.egress_grant import MAX_HOST_CHARS
from sandpod_contract.file_names import name_problem
from sandpod_contract.models import (
    CPU_BOUNDS,
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_MAX_LIFETIME_SECONDS,
    MAX_ALLOW_RULES,
    MAX_ARG_CHARS,
    MAX_ARGS,
    MAX_FILES,
    MAX_NAME_LENGTH,
    MEMORY_BOUNDS,
    RELATIVE_PATH_PATTERN,
    BlockedEgress,
    Diagnostic,
    EgressRule,
    IdleTimeoutSeconds,
    LifetimeSeconds,
    LintRules,
    Network,
    OutputBytes,
    PortRule,
    ReportedBy,
    TimeoutSeconds,
)

from sandpod_gateway.kube.service import PageData, Resource

Item = TypeVar("Item")


def _utf8_encodable(value: str) -> str:
    # JSON may carry lone surrogates (\ud800) that no Kubernetes object can hold.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from exc
    return value


Text = Annotated[str, AfterValidator(_utf8_encodable)]


def _trusted_name(value: object) -> object:
    # Before the path pattern (which allows none of them either), so that the refusal
    # names the character: a control, bidirectional or invisible one.
    if isinstance(value, str) and (problem := name_problem(value)) is not None:
        raise PydanticCustomError(
            "file_name",
            "{problem} in the name: names with control, bidirectional or invisible format "
            "characters are refused",
            {"problem": problem},
        )
    return value


# A file name or path a person can trust on sight (sandpod_contract.file_names).
TrustedName = BeforeValidator(_trusted_name)
Memory = Annotated[
    str,
    Field(max_length=32, examples=["256Mi"]),
    AfterValidator(MEMORY_BOUNDS.check),
]
Cpu = Annotated[str, Field(max_length=32, examples=["500m"]), AfterValidator(CPU_BOUNDS.check)]


HOST_ENTRY_MESSAGE = (
    "must be a host name (pypi.org), *. and a domain for every name below it "
    "(*.example.org), or either with :port (files.pythonhosted.org:443); not a URL, "
    "not an IP address"
)


def host_rule(entry: str) -> EgressRule:
    """An allow_hosts entry as the allowlist entry it stands for (ports 80 and 443 when it
    names none)."""
    host, colon, port = entry.lower().partition(":")
    try:
        if colon and not (port.isascii() and port.isdigit()):
            raise ValueError(port)
        return EgressRule(host=host, ports=[PortRule(port=int(port))] if colon else [])
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"{entry!r} {HOST_ENTRY_MESSAGE}") from exc


def _host_entry(entry: str) -> str:
    host_rule(entry)
    return entry.lower()


AllowHost = Annotated[
    str,
    Field(min_length=1, max_length=MAX_HOST_CHARS + len(":65535")),
    AfterValidator(_host_entry),
]
AllowHosts = Annotated[
    list[AllowHost] | None,
    Field(
        max_length=MAX_ALLOW_RULES,
        description="Hosts the program may reach over HTTP and HTTPS, through the platform's "
        "egress proxy (HTTP_PROXY and HTTPS_PROXY are set in the sandbox; pip, npm, curl and "
        "requests use them): a host name (pypi.org), *. and a domain for every name below it "
        "(*.githubusercontent.com), or either with :port; ports 80 and 443 when none is "
        "given. pip needs pypi.org and files.pythonhosted.org. Only hosts the tenant is "
        "allowed: another ends the run with reason InvalidSpec. Omitted: no network at all.",
        examples=[["pypi.org", "files.pythonhosted.org:443"]],
    ),
]


def hosts_network(entries: list[str]) -> Network:
    """The allowlist that allow_hosts stands for."""
    return Network(egress="allowlist", allow=[host_rule(entry) for entry in entries])


class NetworkFields(BaseModel):
    """The sandbox's network: none unless asked for, with the full allowlist or hosts only."""

    network: Network | None = Field(
        default=None,
        description="Network access of the sandbox, as the CodeExecution's spec.network: "
        "egress none (the default) or allowlist with allow entries that name a cidr or a "
        "host (and ports). Entries outside what the platform and the tenant allow end the "
        "run (or the session) with reason InvalidSpec, or are refused at create (422).",
    )
    allow_hosts: AllowHosts = None

    @model_validator(mode="after")
    def _one_network(self) -> Self:
        if self.network is not None and self.allow_hosts:
            raise ValueError("give network or allow_hosts, not both")
        return self

    def network_spec(self) -> Network:
        """The spec's network: as asked for, else none."""
        if self.allow_hosts:
            return hosts_network(self.allow_hosts)
        return self.network or Network()


class ExecutionStatus(StrEnum):
    pending = "pending"
    running = "running"
    success = "success"
    error = "error"
    compile_error = "compile_error"
    timeout = "timeout"
    cancelled = "cancelled"
    sandbox_error = "sandbox_error"


TERMINAL_STATUSES = frozenset(
    {
        ExecutionStatus.success,
        ExecutionStatus.error,
        ExecutionStatus.compile_error,
        ExecutionStatus.timeout,
        ExecutionStatus.cancelled,
        ExecutionStatus.sandbox_error,
    }
)


class FileInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, TrustedName] = Field(
        min_length=1,
        max_length=255,
        pattern=RELATIVE_PATH_PATTERN,
        description="Relative path in the work directory, e.g. data/input.csv",
    )
    content: Text | None = Field(default=None, description="The file's text")
    content_base64: str | None = Field(
        default=None, description="Or the file's bytes in base64 (binary files)"
    )

    @model_validator(mode="after")
    def _one_content(self) -> "FileInput":
        if (self.content is None) == (self.content_base64 is None):
            raise ValueError("give exactly one of content and content_base64")
        return self


class FileOutput(BaseModel):
    """A file the program left in its outputs directory (/tmp/outputs)."""

    path: str = Field(description="Path relative to the outputs directory")
    size: int
    media_type: str
    sha256: str
    stored: bool = Field(
        description="Whether its content is kept (GET /v1/executions/{id}/files/{path})"
    )
    content_base64: str | None = Field(
        default=None,
        description="The content, when it fits in the tenant's inline limit "
        "(maxInlineFileBytes in total per result)",
    )


class ProgramFields(BaseModel):
    """What a program carries, in a session or not."""

    model_config = ConfigDict(extra="forbid")

    code: Annotated[Text, Field(min_length=1, description="The program text")]
    stdin: Text | None = None
    args: list[Annotated[Text, Field(max_length=MAX_ARG_CHARS)]] = Field(
        default_factory=list, max_length=MAX_ARGS
    )
    files: list[FileInput] = Field(default_factory=list, max_length=MAX_FILES)
    timeout_seconds: TimeoutSeconds | None = Field(
        default=None,
        description="Wall-clock limit in seconds; default from the gateway, "
        "at most the tenant's maximum",
    )
    max_output_bytes: OutputBytes | None = Field(
        default=None,
        description="Cap per output stream; the rest is dropped and *_truncated set",
    )


Mode = Literal["run", "lint"]
MODE_DESCRIPTION = (
    "run (default): execute. lint: check the code for errors instead of running it "
    "(languages with a linter, see GET /v1/languages; python: ruff); the result's "
    "diagnostics list the findings"
)


class CreateExecutionRequest(ProgramFields, NetworkFields):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"language": "python", "code": "print(2 + 2)"}]},
    )

    language: str = Field(
        min_length=1, max_length=MAX_NAME_LENGTH, description="See GET /v1/languages"
    )
    mode: Mode = Field(default="run", description=MODE_DESCRIPTION)
    memory: Memory | None = Field(default=None, description="Memory limit, e.g. 256Mi")
    cpu: Cpu | None = Field(default=None, description="CPU limit, e.g. 500m")


class SessionExecutionRequest(ProgramFields):
    """A run in a session: the session's language, sandbox and limits."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"code": "x = 41\nx + 1"}]}
    )

    language: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        description="The session's language (optional; another one is refused)",
    )
    mode: Mode = Field(
        default="run",
        description=MODE_DESCRIPTION + ". A lint checks the code in a sandbox of its own, "
        "beside the session: the session's state is neither used nor changed",
    )


class SessionCommandRequest(BaseModel):
    """A shell command in a session's sandbox, beside its interpreter."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"command": "ls -la && pip list"}]}
    )

    command: Annotated[Text, Field(min_length=1, description="Run by `/bin/bash -lc`")]
    env: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=MAX_NAME_LENGTH)],
        Annotated[Text, Field(max_length=MAX_ARG_CHARS)],
    ] = Field(default_factory=dict, max_length=MAX_ARGS, description="Added to its environment")
    cwd: Annotated[str, Field(pattern=RELATIVE_PATH_PATTERN, max_length=255)] | None = Field(
        default=None, description="Relative to the session's work directory (default: it)"
    )
    timeout_seconds: TimeoutSeconds | None = Field(
        default=None, description="Wall-clock limit in seconds, as for a run"
    )


class DiagnosticLocation(BaseModel):
    line: int | None = Field(default=None, description="1-based line")
    column: int | None = Field(default=None, description="1-based column")


class LintDiagnostic(BaseModel):
    """One finding of the linter (mode lint): its rule, what it found, and where."""

    code: str | None = Field(default=None, description="Rule code, e.g. F401")
    message: str = Field(description="What the linter found")
    line: int | None = Field(default=None, description="1-based line (also in location)")
    column: int | None = Field(default=None, description="1-based column (also in location)")
    location: DiagnosticLocation

    @classmethod
    def of(cls, found: Diagnostic) -> "LintDiagnostic":
        return cls(
            code=found.code,
            message=found.message,
            line=found.line,
            column=found.column,
            location=DiagnosticLocation(line=found.line, column=found.column),
        )


class ExecutionResult(BaseModel):
    id: str
    status: ExecutionStatus
    language: str
    mode: str = "run"
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    execution_time_ms: int | None = None
    peak_memory_bytes: int | None = Field(
        default=None,
        description="The program's peak resident memory in bytes, as the sandbox's runner "
        "measured it",
    )
    error_message: str | None = Field(
        default=None,
        description="What went wrong, in the platform's words. A Python program that exited "
        "with code 1 after a traceback also gets its exception, quoted: '; the last traceback "
        "on its stderr reads \"NameError: name 'x' is not defined\"' (the program's words: "
        "it could have printed any traceback)",
    )
    reason: str | None = None
    retryable: bool | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    diagnostics: list[LintDiagnostic] | None = Field(
        default=None,
        description="mode lint: the linter's findings, each {code, message, location: {line, "
        "column}} (line and column also at the top level); [] when the code is clean",
    )
    compile_output: str | None = Field(
        default=None,
        description="What the compiler wrote (compiled languages: go, csharp), apart from the "
        "program's stdout and stderr; with status compile_error the program did not run",
    )
    compile_output_truncated: bool = False
    files: list[FileOutput] = Field(
        default_factory=list, description="Files the program left in /tmp/outputs"
    )
    files_truncated: bool = Field(
        default=False, description="Some output files were left out (count or size limits)"
    )
    egress_blocked: list[BlockedEgress] | None = Field(
        default=None,
        description="Requests the egress proxy refused (a host not allowed, a non-public "
        "address), per destination: host, port, count; most frequent first",
    )
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    session: str | None = Field(default=None, description="The session it ran in, if any")
    result: str | None = Field(
        default=None,
        description="Python, and JavaScript and TypeScript in a session: the trailing "
        "expression's value (the last line, when it is an expression) as text (Python's repr, "
        "Node's util.inspect), as the program's interpreter reported it; null when there is "
        "none, its value is None (undefined), or the program failed",
    )
    state_lost: bool = Field(
        default=False,
        description="In a session: the interpreter was restarted by or before this run, so "
        "earlier variables and imports are gone (error_message says why)",
    )
    reported_by: ReportedBy | None = Field(
        default=None,
        description="Whose word exit_code, stdout, stderr and result are: runner (the "
        "sandbox's runner saw the program end) or sessionKernel (a Python, JavaScript or "
        "TypeScript session's "
        "interpreter answered; a session is one trust domain, so an earlier run in it can "
        "have changed what it reports); null when no runner reported",
    )


class Page(BaseModel, Generic[Item]):
    """One page of a list; its subclasses name the kind of item."""

    items: list[Item]
    next_cursor: str | None = Field(
        default=None, description="Pass as ?cursor= to get the next page; null on the last page"
    )

    @classmethod
    def of(cls, data: PageData, item: Callable[[Resource], Item]) -> Self:
        return cls(items=[item(resource) for resource in data.items], next_cursor=data.next_cursor)


class ExecutionPage(Page[ExecutionResult]):
    pass


class OutputEvent(BaseModel):
    """Data of the SSE events ``stdout`` and ``stderr``."""

    data: str


class LanguageInfo(BaseModel):
    name: str
    version: str | None = None
    description: str | None = None
    lint: bool = Field(default=False, description="Whether mode=lint is available")
    lint_rules: LintRules | None = Field(
        default=None,
        description="The rules a lint checks by default (select, ignore: the linter's codes "
        "or prefixes); a tenant may have its own",
    )
    compiled: bool = Field(
        default=False,
        description="Whether the program is compiled before it runs (a build failure is "
        "status compile_error, with compile_output)",
    )


class LanguageList(BaseModel):
    languages: list[LanguageInfo]


class SessionStatus(StrEnum):
    starting = "starting"
    ready = "ready"
    busy = "busy"
    ended = "ended"


class CreateSessionRequest(NetworkFields):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"language": "python"}]}
    )

    language: str = Field(
        min_length=1, max_length=MAX_NAME_LENGTH, description="See GET /v1/languages"
    )
    memory: Memory | None = Field(default=None, description="Memory limit, e.g. 256Mi")
    cpu: Cpu | None = Field(default=None, description="CPU limit, e.g. 500m")
    idle_timeout_seconds: IdleTimeoutSeconds | None = Field(
        default=None,
        description="End the session this long after its last run; "
        f"default {DEFAULT_IDLE_TIMEOUT_SECONDS} s, at most the tenant's maximum",
    )
    max_lifetime_seconds: LifetimeSeconds | None = Field(
        default=None,
        description="End the session this long after it was opened; "
        f"default {DEFAULT_MAX_LIFETIME_SECONDS} s, at most the tenant's maximum",
    )


class SessionInfo(BaseModel):
    id: str
    status: SessionStatus
    language: str
    reason: str | None = Field(
        default=None, description="Why it is in this state, e.g. IdleTimeout"
    )
    message: str | None = None
    memory: str | None = None
    cpu: str | None = None
    idle_timeout_seconds: int
    max_lifetime_seconds: int
    execution_count: int = 0
    start_mode: str | None = Field(default=None, description="warm (from a pool) or cold")
    created_at: datetime | None = None
    started_at: datetime | None = None
    last_activity_at: datetime | None = None
    expires_at: datetime | None = Field(
        default=None, description="When it ends unless used again (idle or lifetime deadline)"
    )


class SessionPage(Page[SessionInfo]):
    pass


class TenantLimitsInfo(BaseModel):
    max_timeout_seconds: int
    max_memory: str
    max_cpu: str
    max_concurrent: int = Field(description="Executions not finished, at once")
    max_open_waits: int = Field(
        description="Requests waiting for a result plus output streams open at once, per "
        "gateway replica"
    )
    max_waits_per_execution: int = Field(description="Of those, on one execution")
    max_inline_file_bytes: int = Field(
        description="Bytes of output files returned inline in one result, in total"
    )
    max_stored_bytes: int = Field(
        description="Bytes the executions of its namespace may keep (spec and status as JSON, "
        "stored output files); beyond, 429 stored_bytes_limit"
    )
    max_sessions: int = Field(description="Sessions not yet ended, at once")
    max_idle_timeout_seconds: int = Field(description="Largest idle timeout a session may ask")
    max_lifetime_seconds: int = Field(description="Largest lifetime a session may ask for")
    max_file_bytes: int = Field(description="Largest file uploaded to or read from a session")
    requests_per_second: int = Field(
        description="Requests per second the tenant may make on average (all replicas "
        "together); beyond, 429 rate_limited"
    )
    request_burst: int = Field(description="Requests it may make at once above that rate")


class TenantUsageInfo(BaseModel):
    """What the tenant uses now, as the operator counts it (the counts its limits hold)."""

    running: int = Field(description="Executions not finished")
    sessions: int = Field(description="Sessions not ended")
    stored_bytes: int = Field(description="Bytes its namespace's executions keep")


class TenantDefaults(BaseModel):
    timeout_seconds: int
    memory: str
    cpu: str


class TenantInfo(BaseModel):
    """Who the key belongs to and what it may ask for (clients size their inputs by it)."""

    name: str
    limits: TenantLimitsInfo
    defaults: TenantDefaults = Field(description="What a request that names no value gets")
    max_code_bytes: int = Field(description="code + files + stdin + args, UTF-8 bytes")
    usage: TenantUsageInfo | None = Field(
        default=None,
        description="What it uses now; absent when the gateway counts without the operator "
        "(no direct path) or cannot reach it",
    )
    lint_rules: LintRules | None = Field(
        default=None,
        description="The rules this tenant's lints check, when it has its own (else each "
        "language's lint_rules, GET /v1/languages)",
    )
