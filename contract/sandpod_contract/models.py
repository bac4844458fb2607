"""The CodeExecution resource as pydantic models: the one source of truth for its schema.

The CRD in crds/ is generated from these models (see crd.py), the operator writes the status
through CodeExecutionStatus, and the gateway imports them to validate and build resources
and to read the status. Keep this module free of kopf and Kubernetes client imports.

Every rule the API server enforces through a CEL expression (`x-kubernetes-validations`) is
also enforced here by a validator, with the same message, so that both refuse the same specs.
"""

import base64
import binascii
import ipaddress
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from sandpod_contract.egress_grant import DEFAULT_HOST_PORTS, HOST_PATTERN, MAX_HOST_CHARS
from sandpod_contract.quantities import QuantityBounds

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "TimedOut", "Error", "Cancelled"]
# Whose word a result is: the runner's observation of the program's process, or the answer
# of a Python session's kernel (docs/runner-protocol.md, "A session is one trust domain").
ReportedBy = Literal["runner", "sessionKernel"]
# The reason of a Failed execution whose program did not build (so it never ran).
COMPILATION_ERROR = "CompilationError"
TERMINAL_PHASES: frozenset[str] = frozenset(
    {"Succeeded", "Failed", "TimedOut", "Error", "Cancelled"}
)

KIB = 1024
MAX_SOURCE_CHARS = 256 * KIB
MAX_STDIN_CHARS = 256 * KIB
MAX_FILE_CHARS = 256 * KIB
MAX_FILES = 32
MAX_CONTENT_CHARS = 512 * KIB
MAX_ARGS = 64
MAX_ARG_CHARS = 4 * KIB
MIN_TIMEOUT_SECONDS = 1
MAX_TIMEOUT_SECONDS = 300
# The most the operator's build time limit (compileTimeoutSeconds) may be.
MAX_COMPILE_TIMEOUT_SECONDS = 300
MAX_TTL_SECONDS = 7 * 24 * 3600
MIN_OUTPUT_BYTES = KIB
MAX_OUTPUT_BYTES = 8 * KIB * KIB
DEFAULT_OUTPUT_BYTES = KIB * KIB
DEFAULT_TIMEOUT_SECONDS = 10
# What a tenant namespace may keep in executions (their spec and status as JSON, and their
# stored output files), unless its tenant says otherwise: etcd's whole default quota is 2 GiB.
DEFAULT_MAX_STORED_BYTES = 256 * KIB * KIB
MAX_ALLOW_RULES = 16

CPU_BOUNDS = QuantityBounds(minimum="10m", maximum="16")
MEMORY_BOUNDS = QuantityBounds(minimum="16Mi", maximum="64Gi")
EPHEMERAL_STORAGE_BOUNDS = QuantityBounds(minimum="1Mi", maximum="16Gi")

LANGUAGE_PATTERN = r"^[a-z][a-z0-9-]*$"
# Relative, and no segment starts with a dot (so neither "." nor ".." nor hidden files).
RELATIVE_PATH_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 63

NAME_RULE: JsonDict = {
    # The API server already checks that the name is a DNS subdomain; a label is one without
    # dots, at most 63 long (a cheaper rule than a regex over an unbounded string).
    "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && !self.metadata.name.contains('.')",
    "message": "metadata.name must be a DNS label: at most 63 lowercase letters, digits and"
    " '-', starting and ending with a letter or digit (it becomes a label value on the pod)",
}
IMMUTABLE_RULE: JsonDict = {"rule": "self == oldSelf", "message": "spec is immutable"}
CONTENT_SIZE_MESSAGE = (
    f"source, stdin and files together must not exceed {MAX_CONTENT_CHARS} characters"
)
CONTENT_SIZE_RULE: JsonDict = {
    "rule": "size(self.source)"
    " + (has(self.stdin) ? size(self.stdin) : 0)"
    " + (has(self.files) ? self.files.map(f, size(f.content)).sum() : 0)"
    f" <= {MAX_CONTENT_CHARS}",
    "message": CONTENT_SIZE_MESSAGE,
}
ALLOWLIST_MESSAGE = "network.allow must be non-empty when egress is allowlist, and empty otherwise"
ALLOWLIST_RULE: JsonDict = {
    "rule": "self.egress == 'allowlist' ? (has(self.allow) && size(self.allow) > 0)"
    " : (!has(self.allow) || size(self.allow) == 0)",
    "message": ALLOWLIST_MESSAGE,
}
CIDR_RULE: JsonDict = {"rule": "isCIDR(self)", "message": "cidr must be a CIDR such as 10.0.0.0/8"}
DESTINATION_MESSAGE = "an allow entry names exactly one of cidr and host"
DESTINATION_RULE: JsonDict = {
    "rule": "has(self.cidr) != has(self.host)",
    "message": DESTINATION_MESSAGE,
}
HOST_PORTS_MESSAGE = "a host entry's ports are TCP (the egress proxy carries HTTP and HTTPS)"
HOST_PORTS_RULE: JsonDict = {
    "rule": "!has(self.host) || !has(self.ports) || self.ports.all(p, p.protocol == 'TCP')",
    "message": HOST_PORTS_MESSAGE,
}


def format_time(value: datetime) -> str:
    """A status timestamp as Kubernetes writes them: UTC, whole seconds."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> datetime | None:
    """A timestamp Kubernetes (or anyone) wrote, as an aware datetime (UTC when it names no
    zone); None when it is missing or not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, PlainSerializer(format_time, return_type=str, when_used="json")]


def execution_name_problem(name: str) -> str | None:
    """Why `name` cannot name a CodeExecution (the CRD refuses it too), or None."""
    if len(name) > MAX_NAME_LENGTH or re.fullmatch(DNS_LABEL_PATTERN, name) is None:
        return str(NAME_RULE["message"])
    return None


def _number_as_text(value: Any) -> Any:
    # YAML `cpu: 1` arrives as an int; Kubernetes quantities accept both.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _quantity_message(bounds: QuantityBounds, what: str) -> str:
    return f"{what} must be a quantity between {bounds.minimum} and {bounds.maximum}"


def _within_bounds(bounds: QuantityBounds, what: str) -> AfterValidator:
    def check(value: str) -> str:
        try:
            return bounds.check(value)
        except ValueError as exc:
            raise ValueError(_quantity_message(bounds, what)) from exc

    return AfterValidator(check)


def _quantity_field(bounds: QuantityBounds, what: str, example: str) -> Any:
    return Field(
        description=f"{what.capitalize()} limit as a Kubernetes quantity, e.g. {example}, "
        f"between {bounds.minimum} and {bounds.maximum}. Defaults and lower maximums come "
        "from the operator's settings.",
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {"rule": bounds.cel_rule(), "message": _quantity_message(bounds, what)}
            ],
        },
    )


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class SourceFile(_Model):
    """An extra file placed in the work directory next to the program."""

    path: str = Field(
        min_length=1,
        max_length=255,
        pattern=RELATIVE_PATH_PATTERN,
        description="Path relative to the work directory, e.g. data/input.csv. No absolute "
        "paths, no '..', no segment starting with a dot.",
    )
    content: str = Field(
        max_length=MAX_FILE_CHARS,
        description="The file's text content, or with encoding base64 its bytes in base64.",
    )
    encoding: Literal["base64"] | None = Field(
        default=None,
        description="base64: content is base64 (binary files); omitted: content is text.",
    )

    @model_validator(mode="after")
    def _base64_content(self) -> "SourceFile":
        if self.encoding == "base64":
            try:
                base64.b64decode(self.content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"{self.path}: content is not valid base64") from exc
        return self

    def data(self) -> bytes:
        """The file's bytes."""
        if self.encoding == "base64":
            return base64.b64decode(self.content)
        return self.content.encode()


CpuQuantity = Annotated[
    str,
    BeforeValidator(_number_as_text),
    _within_bounds(CPU_BOUNDS, "cpu"),
    _quantity_field(CPU_BOUNDS, "cpu", "500m"),
]
MemoryQuantity = Annotated[
    str,
    BeforeValidator(_number_as_text),
    _within_bounds(MEMORY_BOUNDS, "memory"),
    _quantity_field(MEMORY_BOUNDS, "memory", "256Mi"),
]
StorageQuantity = Annotated[
    str,
    BeforeValidator(_number_as_text),
    _within_bounds(EPHEMERAL_STORAGE_BOUNDS, "ephemeral storage"),
    _quantity_field(EPHEMERAL_STORAGE_BOUNDS, "ephemeral storage", "256Mi"),
]


class Resources(_Model):
    """Resource limits of the sandbox pod. Omitted values come from the operator's defaults."""

    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = None
    ephemeral_storage: StorageQuantity | None = None


LanguageName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=63,
        pattern=LANGUAGE_PATTERN,
        description="Language of the program: a key of the operator's language catalog, "
        "e.g. python, javascript, typescript, bash.",
    ),
]


class PortRule(_Model):
    """A destination port that egress may reach."""

    port: int = Field(ge=1, le=65535, description="Destination port number.")
    protocol: Literal["TCP", "UDP"] = Field(default="TCP", description="TCP or UDP.")


class EgressRule(_Model):
    """A destination egress may reach: a network (directly) or a host name (by the proxy)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [DESTINATION_RULE, HOST_PORTS_RULE]}
    )

    cidr: str | None = Field(
        default=None,
        max_length=64,
        description="Destination network in CIDR notation, e.g. 203.0.113.0/24, reached "
        "directly. DNS is not configured in sandboxes, so programs must use addresses.",
        json_schema_extra={"x-kubernetes-validations": [CIDR_RULE]},
    )
    host: str | None = Field(
        default=None,
        max_length=MAX_HOST_CHARS,
        pattern=HOST_PATTERN,
        description="Destination host name, e.g. pypi.org, or *. and a domain for every name "
        "below it, e.g. *.githubusercontent.com. Reached through the platform's egress "
        "proxy (HTTP_PROXY and HTTPS_PROXY are set in the sandbox): HTTPS by the name in "
        "CONNECT, plain HTTP by the request's host; only public addresses.",
    )
    ports: list[PortRule] = Field(
        default_factory=list,
        max_length=16,
        description="Destination ports; empty means every port for a cidr, 80 and 443 for a host.",
    )

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            ipaddress.ip_network(value, strict=True)
        except ValueError as exc:
            raise ValueError(str(CIDR_RULE["message"])) from exc
        return value

    @model_validator(mode="after")
    def _one_destination(self) -> "EgressRule":
        if (self.cidr is None) == (self.host is None):
            raise ValueError(DESTINATION_MESSAGE)
        if self.host is not None and any(p.protocol != "TCP" for p in self.ports):
            raise ValueError(HOST_PORTS_MESSAGE)
        return self

    @property
    def host_ports(self) -> tuple[int, ...]:
        """The ports of a host entry (80 and 443 when none are listed)."""
        return tuple(p.port for p in self.ports) or DEFAULT_HOST_PORTS


class Network(_Model):
    """Network access of the sandbox. The default is no network at all, DNS included."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [ALLOWLIST_RULE]})

    egress: Literal["none", "allowlist"] = Field(
        default="none",
        description="none: no traffic in or out. allowlist: outbound traffic only to the "
        "networks and hosts listed in allow.",
    )
    allow: list[EgressRule] = Field(
        default_factory=list,
        max_length=MAX_ALLOW_RULES,
        description="Where egress may go when egress is allowlist.",
    )

    @model_validator(mode="after")
    def _allow_matches_egress(self) -> "Network":
        if (self.egress == "allowlist") != bool(self.allow):
            raise ValueError(ALLOWLIST_MESSAGE)
        return self

    @property
    def cidr_rules(self) -> list[EgressRule]:
        return [rule for rule in self.allow if rule.cidr is not None]

    @property
    def host_rules(self) -> list[EgressRule]:
        return [rule for rule in self.allow if rule.host is not None]


SessionName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL_PATTERN)
]


# A linter rule code or prefix (ruff's: ALL, E, F401, RUF029), never an option.
LINT_RULE_PATTERN = r"^[A-Z]+[0-9]*$"
MAX_LINT_RULES = 128
LintRule = Annotated[str, Field(min_length=1, max_length=16, pattern=LINT_RULE_PATTERN)]


class LintRules(_Model):
    """Which of the linter's rules a lint checks, as codes or prefixes (ruff's)."""

    select: list[LintRule] = Field(
        min_length=1,
        max_length=MAX_LINT_RULES,
        description="Rules checked: codes or prefixes, e.g. ALL, E, F401.",
    )
    ignore: list[LintRule] = Field(
        default_factory=list,
        max_length=MAX_LINT_RULES,
        description="Rules left out of those, e.g. D203, FBT.",
    )

    def arguments(self) -> list[str]:
        """The linter's options for these rules (ruff's --select and --ignore)."""
        options = [f"--select={','.join(self.select)}"]
        if self.ignore:
            options.append(f"--ignore={','.join(self.ignore)}")
        return options


# The bounds a request field carries, written once for the contract and the gateway.
TimeoutSeconds = Annotated[int, Field(ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS)]
OutputBytes = Annotated[int, Field(ge=MIN_OUTPUT_BYTES, le=MAX_OUTPUT_BYTES)]
ObjectName = Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL_PATTERN)]
RuntimeClassName = Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
ObservedGeneration = Annotated[
    int | None, Field(description="metadata.generation the status was written for.")
]


def _conditions_field(description: str) -> Any:
    """A status's conditions: a list keyed by type, empty by default."""
    return Field(
        default_factory=list,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class CodeExecutionSpec(_Model):
    """What to run and under which limits. Immutable once created."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [IMMUTABLE_RULE, CONTENT_SIZE_RULE]}
    )

    language: LanguageName
    source: str = Field(
        max_length=MAX_SOURCE_CHARS,
        description="The program text, stored as the language's source file in the work directory.",
    )
    files: list[SourceFile] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="Extra files placed in the work directory before the program starts.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["path"]},
    )
    stdin: str | None = Field(
        default=None,
        max_length=MAX_STDIN_CHARS,
        description="Text fed to the program's standard input (empty input when omitted).",
    )
    args: list[Annotated[str, Field(max_length=MAX_ARG_CHARS)]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="Command-line arguments appended to the language's command.",
    )
    mode: Literal["run", "lint"] = Field(
        default="run",
        description="run: execute the program. lint: only check it statically (languages "
        "with a linter, e.g. python with ruff) and report status.diagnostics.",
    )
    lint: LintRules | None = Field(
        default=None,
        description="lint mode: the rules to check, instead of the language's (its catalog "
        "entry's lintRules); only for languages whose catalog entry has lintRules.",
    )
    timeout_seconds: TimeoutSeconds = Field(
        default=DEFAULT_TIMEOUT_SECONDS,
        description="Wall-clock limit of the program in seconds; it is killed after that and "
        "the phase is TimedOut. The operator may enforce a lower maximum.",
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="cpu, memory and ephemeral-storage limits of the sandbox.",
    )
    network: Network = Field(
        default_factory=Network,
        description="Network access; none by default.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TTL_SECONDS,
        description="Delete the execution this many seconds after it finished. Defaults to "
        "the operator's setting (one hour unless configured otherwise).",
    )
    max_output_bytes: OutputBytes = Field(
        default=DEFAULT_OUTPUT_BYTES,
        description="Cap on each of stdout and stderr captured by the runner; the rest is "
        "counted and dropped, and the truncated flag is set.",
    )
    runtime_class_name: RuntimeClassName | None = Field(
        default=None,
        description="RuntimeClass of the sandbox pod. Defaults to the operator's setting "
        "(gvisor); only classes the operator allows are accepted.",
    )
    session: ObjectName | None = Field(
        default=None,
        description="Name of a CodeSession in this namespace to run in: its sandbox, files and "
        "interpreter state. Executions of one session run one at a time, in creation order; "
        "resources and network come from the session.",
    )

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, files: list[SourceFile]) -> list[SourceFile]:
        paths = [f.path for f in files]
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise ValueError(f"duplicate file paths: {', '.join(duplicates)}")
        return files

    @model_validator(mode="after")
    def _content_size(self) -> "CodeExecutionSpec":
        total = len(self.source) + len(self.stdin or "") + sum(len(f.content) for f in self.files)
        if total > MAX_CONTENT_CHARS:
            raise ValueError(CONTENT_SIZE_MESSAGE)
        return self


class Condition(_Model):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(
        description="Of an execution: Accepted (children created), Started (the program "
        "started), Completed (a terminal phase was reached), Succeeded (it ended with phase "
        "Succeeded). Of a pool: Ready (size free pods are ready)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason of the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: Timestamp = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation this condition was set for."
    )


class Diagnostic(_Model):
    """One finding of the linter (lint mode)."""

    model_config = ConfigDict(extra="ignore")

    code: str | None = Field(default=None, description="Rule code, e.g. F401.")
    message: str = Field(description="What the linter found.")
    line: int | None = Field(default=None, description="1-based line.")
    column: int | None = Field(default=None, description="1-based column.")


class OutputFileStatus(_Model):
    """A file the program left in its outputs directory (/tmp/outputs)."""

    path: str = Field(description="Path relative to the outputs directory.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(description="Hex SHA-256 of the content.")
    media_type: str = Field(description="Media type from the file name's extension.")
    key: str | None = Field(
        default=None,
        description="Key of the content in the ConfigMap status.outputsConfigMap "
        "(binaryData), when stored.",
    )
    stored: bool = Field(
        description="Whether the content is stored (false: over the per-execution limit)."
    )


MAX_BLOCKED_REPORTED = 20


class BlockedEgress(_Model):
    """Requests the egress proxy refused to one destination (as the proxy saw it)."""

    host: str = Field(max_length=MAX_HOST_CHARS, description="Host name or address asked for.")
    port: int = Field(ge=0, le=65535, description="Destination port asked for.")
    count: int = Field(ge=1, description="How many requests were refused.")


class CodeExecutionStatus(_Model):
    """What happened, written by the operator."""

    phase: Phase = Field(
        description="Pending, Running, then one terminal phase: Succeeded (exit code 0), "
        "Failed (non-zero exit, signal or OOM), TimedOut, Error (the sandbox could not run "
        "the program) or Cancelled."
    )
    reason: str | None = Field(
        default=None,
        description="CamelCase cause of the phase, e.g. Completed, NonZeroExit, OOMKilled, "
        "DeadlineExceeded, CompilationError, RuntimeClassNotFound, ImageNotFound, "
        "Unschedulable, InvalidSpec.",
    )
    message: str | None = Field(default=None, description="Human-readable explanation.")
    retryable: bool | None = Field(
        default=None,
        description="Whether creating the same execution again may succeed (the failure was "
        "not caused by the program or its spec).",
    )
    exit_code: int | None = Field(default=None, description="Exit code of the program.")
    signal: int | None = Field(default=None, description="Signal that killed the program.")
    stdout: str | None = Field(default=None, description="Tail of the standard output.")
    stderr: str | None = Field(default=None, description="Tail of the standard error.")
    stdout_truncated: bool | None = Field(
        default=None, description="stdout is not the whole output (capped or tail only)."
    )
    stderr_truncated: bool | None = Field(
        default=None, description="stderr is not the whole output (capped or tail only)."
    )
    diagnostics: list[Diagnostic] | None = Field(
        default=None, description="Linter findings (lint mode)."
    )
    compile_output: str | None = Field(
        default=None,
        description="What the compiler wrote (compiled languages), apart from the program's "
        "output; on reason CompilationError the program did not run.",
    )
    compile_output_truncated: bool | None = Field(
        default=None, description="compileOutput is not all the compiler wrote."
    )
    outputs: list[OutputFileStatus] | None = Field(
        default=None,
        description="Files the program left in /tmp/outputs that came back intact; the "
        "content of those stored is in the ConfigMap outputsConfigMap.",
    )
    outputs_config_map: str | None = Field(
        default=None,
        description="The ConfigMap (owned by the execution) whose binaryData holds the "
        "stored output files, under their key.",
    )
    outputs_truncated: bool | None = Field(
        default=None,
        description="Some output files were left out (count, size or walk limits).",
    )
    started_at: Timestamp | None = Field(default=None, description="When the program started.")
    finished_at: Timestamp | None = Field(
        default=None, description="When the execution reached its terminal phase."
    )
    duration_ms: int | None = Field(
        default=None, description="Wall-clock run time of the program in milliseconds."
    )
    peak_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="The program's peak resident memory (the largest maxrss the runner saw "
        "among its processes), in bytes.",
    )
    pod_name: str | None = Field(default=None, description="Name of the sandbox pod.")
    egress_blocked: list[BlockedEgress] | None = Field(
        default=None,
        max_length=MAX_BLOCKED_REPORTED,
        description="Requests through the egress proxy that were refused (a host not in the "
        "allowlist, a non-public address), per destination, most frequent first.",
    )
    start_mode: Literal["warm", "cold"] | None = Field(
        default=None, description="warm: in a pod from a SandboxPool; cold: in its own pod."
    )
    wait_ms: int | None = Field(
        default=None, ge=0, description="Milliseconds from creation to the program's start."
    )
    session: str | None = Field(
        default=None, description="The CodeSession the execution ran (or waits to run) in."
    )
    result: str | None = Field(
        default=None,
        description="Python, and JavaScript and TypeScript in a session: the program's trailing "
        "expression as text (Python's repr, Node's util.inspect; like a notebook cell), when "
        "its value is not None (undefined) and the program then exited 0; absent otherwise. "
        "The program's interpreter reports it, so it is the program's word, like its output.",
    )
    state_lost: bool | None = Field(
        default=None,
        description="In a session: true when the session's interpreter was restarted (by "
        "this execution or one before it), so earlier variables are gone; message says why.",
    )
    reported_by: ReportedBy | None = Field(
        default=None,
        description="Whose word exitCode, stdout, stderr and result are. runner: the "
        "sandbox's runner saw the program's process end (run-once, pool and other languages' "
        "session runs). sessionKernel: the session's long-lived interpreter (Python, Node) "
        "reported them, and a session is one trust domain, so an earlier run of the same "
        "session can have changed what it reports. Absent when no runner reported (the "
        "platform decided: reason and message say what it saw).",
    )
    conditions: list[Condition] = _conditions_field(
        "Standard conditions: Accepted, Started, Completed, Succeeded, Queued."
    )
    observed_generation: ObservedGeneration = None


def is_terminal(phase: str | None) -> bool:
    return phase in TERMINAL_PHASES


MAX_POOL_SIZE = 50
MAX_REFILL_PER_MINUTE = 600
MAX_RUNS_PER_SANDBOX = 100_000
MAX_SANDBOX_AGE_SECONDS = 7 * 24 * 3600


class SandboxPoolSpec(_Model):
    """Which sandboxes to keep started, and how many. Mutable: size scales the pool."""

    # A changed language or resources replace the free pods (the pool-template label).

    language: LanguageName
    resources: Resources = Field(
        default_factory=Resources,
        description="cpu, memory and ephemeral-storage limits of each pool pod; an execution "
        "fits the pool when each of its own is at most these.",
    )
    size: int = Field(
        ge=0, le=MAX_POOL_SIZE, description="How many free, started sandbox pods to keep."
    )
    sessions: bool = Field(
        default=False,
        description="true: the pods serve CodeSessions (many executions each, state kept) and "
        "only sessions claim them; false: the pods serve one-off executions, each run in a "
        "fresh box of its own (runsPerSandbox).",
    )
    runs_per_sandbox: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RUNS_PER_SANDBOX,
        description="One-off pools: runs a pod serves, one at a time, each in a fresh box of "
        "its own (its own user, mount and IPC namespaces; work dir, home, /tmp and /dev/shm "
        "made new; its own memory bound), all of one tenant, before it is replaced; a run "
        "that leaves anything behind retires it at once. 1: a pod per run. Omitted: the "
        "operator's POOL_RUNS_PER_SANDBOX. Runs that build (go, csharp) take a pod each.",
    )
    sandbox_max_age_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SANDBOX_AGE_SECONDS,
        description="One-off pools: a pod takes no run once this old (then it is replaced). "
        "Omitted: the operator's POOL_SANDBOX_MAX_AGE_SECONDS.",
    )
    max_refill_per_minute: int | None = Field(
        default=None,
        description="At most this many pods started per minute (refills and the first "
        "fill alike); unlimited when omitted.",
        ge=1,
        le=MAX_REFILL_PER_MINUTE,
    )


class SandboxPoolStatus(_Model):
    """How full the pool is, written by the operator."""

    ready: int = Field(default=0, description="Free pods that are ready to be claimed.")
    total: int = Field(default=0, description="Free pods, ready or still starting.")
    conditions: list[Condition] = _conditions_field(
        "Ready: True when `size` free pods are ready; False with reason Filling, "
        "RefillLimited (maxRefillPerMinute) or InvalidSpec."
    )
    observed_generation: ObservedGeneration = None


SessionPhase = Literal["Starting", "Ready", "Busy", "Ended"]
DEFAULT_IDLE_TIMEOUT_SECONDS = 600
MIN_IDLE_TIMEOUT_SECONDS = 10
DEFAULT_MAX_LIFETIME_SECONDS = 3600
MIN_MAX_LIFETIME_SECONDS = 60
MAX_SESSION_SECONDS = 86400
IdleTimeoutSeconds = Annotated[int, Field(ge=MIN_IDLE_TIMEOUT_SECONDS, le=MAX_SESSION_SECONDS)]
LifetimeSeconds = Annotated[int, Field(ge=MIN_MAX_LIFETIME_SECONDS, le=MAX_SESSION_SECONDS)]


class CodeSessionSpec(_Model):
    """One sandbox kept for one user: executions that name the session run in it, in order,
    and keep its files and (Python) its interpreter's state. Immutable once created."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [IMMUTABLE_RULE]})

    language: LanguageName
    resources: Resources = Field(
        default_factory=Resources,
        description="cpu, memory and ephemeral-storage limits of the session's sandbox.",
    )
    network: Network = Field(
        default_factory=Network, description="Network access of the sandbox; none by default."
    )
    idle_timeout_seconds: IdleTimeoutSeconds = Field(
        default=DEFAULT_IDLE_TIMEOUT_SECONDS,
        description="The session ends this long after its last execution ended (or after it "
        "started, before any).",
    )
    max_lifetime_seconds: LifetimeSeconds = Field(
        default=DEFAULT_MAX_LIFETIME_SECONDS,
        description="The session ends this long after its creation, whatever it is doing "
        "between executions.",
    )
    pool: ObjectName | None = Field(
        default=None,
        description="A SandboxPool (sessions: true) to take the sandbox from. Omitted: any "
        "fitting session pool of the namespace; none free: a sandbox of its own.",
    )


class CodeSessionStatus(_Model):
    """The session's sandbox and where it stands, written by the operator."""

    phase: SessionPhase = Field(
        description="Starting (its sandbox is starting), Ready (waiting for an execution), "
        "Busy (running one), Ended (for good: see reason)."
    )
    reason: str | None = Field(
        default=None,
        description="CamelCase cause of the phase: Started, IdleTimeout, LifetimeExceeded, "
        "Deleted, SandboxLost, StartupTimeout, InvalidSpec.",
    )
    message: str | None = Field(default=None, description="Human-readable explanation.")
    pod_name: str | None = Field(default=None, description="Name of the session's sandbox pod.")
    start_mode: Literal["warm", "cold"] | None = Field(
        default=None, description="warm: its pod came from a SandboxPool; cold: its own pod."
    )
    started_at: Timestamp | None = Field(
        default=None, description="When the session's sandbox was ready."
    )
    last_activity_at: Timestamp | None = Field(
        default=None, description="When its last execution ended."
    )
    expires_at: Timestamp | None = Field(
        default=None,
        description="When the session ends unless an execution comes first: the earlier of "
        "the idle and the lifetime deadlines.",
    )
    execution_count: int = Field(default=0, ge=0, description="Executions run in the session.")
    conditions: list[Condition] = _conditions_field(
        "Ready: True while the session can run executions."
    )
    observed_generation: ObservedGeneration = None
