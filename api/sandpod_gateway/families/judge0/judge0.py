"""Judge0 CE 1.13.1's API over sandpod's executions: pure translation both ways.

A submission is a CodeExecution whose name is its token. What Judge0 knows of a submission and
the execution's spec does not hold (its language id, expected output and limits as asked) is kept
in one annotation, so a later GET answers from the execution alone. The verdict comes from the
execution's status only (phase, exit code, signal, truncation, compile output): never from text
the program printed, except that stdout is compared with expected_output as Judge0 compares it.
"""

import base64
import binascii
import io
import json
import math
import shlex
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError
from sandpod_contract.models import (
    DEFAULT_OUTPUT_BYTES,
    MAX_ARGS,
    MAX_FILES,
    MAX_OUTPUT_BYTES,
    MEMORY_BOUNDS,
    MIN_OUTPUT_BYTES,
    MIN_TIMEOUT_SECONDS,
    CodeExecutionStatus,
)
from sandpod_contract.quantities import parse_quantity

from sandpod_gateway.kube.resources import Resource, execution_result, read_status
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.policy.admission import default_limits
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.schemas import (
    CreateExecutionRequest,
    ExecutionResult,
    ExecutionStatus,
    FileInput,
)
from sandpod_gateway.settings import GatewaySettings

JUDGE0_VERSION = "1.13.1"
SUBMISSION_ANNOTATION = "sandpod.dev/judge0-submission"
KIB = 1024

# Judge0 CE 1.13.1's ids (db/languages/active.rb) of the languages sandpod's catalog may have,
# and how Judge0 names each (the version is the catalog's).
LANGUAGE_IDS: dict[int, str] = {
    46: "bash",
    51: "csharp",
    60: "go",
    63: "javascript",
    71: "python",
    74: "typescript",
}
LANGUAGE_NAMES = {
    "bash": "Bash ({version})",
    "csharp": "C# (Mono {version})",
    "go": "Go ({version})",
    "javascript": "JavaScript (Node.js {version})",
    "python": "Python ({version})",
    "typescript": "TypeScript ({version})",
}


class Status(IntEnum):
    """Judge0's statuses (app/enumerations/status.rb)."""

    IN_QUEUE = 1
    PROCESSING = 2
    ACCEPTED = 3
    WRONG_ANSWER = 4
    TIME_LIMIT_EXCEEDED = 5
    COMPILATION_ERROR = 6
    SIGSEGV = 7
    SIGXFSZ = 8
    SIGFPE = 9
    SIGABRT = 10
    NZEC = 11
    OTHER = 12
    INTERNAL_ERROR = 13
    EXEC_FORMAT_ERROR = 14


STATUS_DESCRIPTIONS = {
    Status.IN_QUEUE: "In Queue",
    Status.PROCESSING: "Processing",
    Status.ACCEPTED: "Accepted",
    Status.WRONG_ANSWER: "Wrong Answer",
    Status.TIME_LIMIT_EXCEEDED: "Time Limit Exceeded",
    Status.COMPILATION_ERROR: "Compilation Error",
    Status.SIGSEGV: "Runtime Error (SIGSEGV)",
    Status.SIGXFSZ: "Runtime Error (SIGXFSZ)",
    Status.SIGFPE: "Runtime Error (SIGFPE)",
    Status.SIGABRT: "Runtime Error (SIGABRT)",
    Status.NZEC: "Runtime Error (NZEC)",
    Status.OTHER: "Runtime Error (Other)",
    Status.INTERNAL_ERROR: "Internal Error",
    Status.EXEC_FORMAT_ERROR: "Exec Format Error",
}
# Status.find_runtime_error_by_status_code: the signal that killed the program.
SIGNAL_STATUSES = {11: Status.SIGSEGV, 25: Status.SIGXFSZ, 8: Status.SIGFPE, 6: Status.SIGABRT}

# The limits sandpod does not set per execution: the sandbox's own (the operator's defaults).
STACK_LIMIT_KB = 8192
PROCESS_LIMIT = 128
# Judge0's defaults: a callback is tried this often (again only when no answer came).
CALLBACK_TRIES = 3
CALLBACK_TIMEOUT_SECONDS = 5.0
MAX_CALLBACK_URL_CHARS = 2048
MAX_OPTION_CHARS = 512
MAX_EXPECTED_OUTPUT_CHARS = 64 * KIB
# Characters Judge0 removes from command_line_arguments before its shell reads them.
SHELL_CONTROL = str.maketrans("", "", "$&;<>|`")

# What GET /submissions/{token} returns without ?fields= (SubmissionSerializer.default_fields).
DEFAULT_FIELDS = (
    "token",
    "time",
    "memory",
    "stdout",
    "stderr",
    "compile_output",
    "message",
    "status",
)
# Every field a submission has (the submissions table's columns, status and language).
ALL_FIELDS = (
    "source_code",
    "language_id",
    "stdin",
    "expected_output",
    "stdout",
    "status_id",
    "created_at",
    "finished_at",
    "time",
    "memory",
    "stderr",
    "token",
    "number_of_runs",
    "cpu_time_limit",
    "cpu_extra_time",
    "wall_time_limit",
    "memory_limit",
    "stack_limit",
    "max_processes_and_or_threads",
    "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit",
    "max_file_size",
    "compile_output",
    "exit_code",
    "exit_signal",
    "message",
    "wall_time",
    "compiler_options",
    "command_line_arguments",
    "redirect_stderr_to_stdout",
    "callback_url",
    "additional_files",
    "enable_network",
    "status",
    "language",
)
# Text fields sent base64-encoded with ?base64_encoded=true.
ENCODED_FIELDS = ("source_code", "stdin", "expected_output", "stdout", "stderr", "compile_output")

Errors = dict[str, list[str]]


class InvalidSubmission(Exception):
    """A submission Judge0 would refuse (422), with its errors per field."""

    def __init__(self, errors: Errors) -> None:
        super().__init__(json.dumps(errors))
        self.errors = errors


class InvalidFields(Exception):
    """?fields= names fields a submission does not have (400)."""

    def __init__(self, fields: list[str]) -> None:
        super().__init__(f"invalid fields: [{', '.join(fields)}]")


class Judge0Config(BaseModel):
    """GET /config_info: every field of Judge0's configuration, as this tenant gets it."""

    maintenance_mode: bool = False
    enable_wait_result: bool = True
    enable_compiler_options: bool = False
    allowed_languages_for_compile_options: list[str] = []
    enable_command_line_arguments: bool = True
    enable_submission_delete: bool = False
    enable_callbacks: bool = False
    callbacks_max_tries: int = CALLBACK_TRIES
    callbacks_timeout: float = CALLBACK_TIMEOUT_SECONDS
    enable_additional_files: bool = True
    max_queue_size: int
    cpu_time_limit: float
    max_cpu_time_limit: float
    cpu_extra_time: float = 0.0
    max_cpu_extra_time: float
    wall_time_limit: float
    max_wall_time_limit: float
    memory_limit: int
    max_memory_limit: int
    stack_limit: int = STACK_LIMIT_KB
    max_stack_limit: int = STACK_LIMIT_KB
    max_processes_and_or_threads: int = PROCESS_LIMIT
    max_max_processes_and_or_threads: int = PROCESS_LIMIT
    enable_per_process_and_thread_time_limit: bool = False
    allow_enable_per_process_and_thread_time_limit: bool = False
    enable_per_process_and_thread_memory_limit: bool = False
    allow_enable_per_process_and_thread_memory_limit: bool = False
    max_file_size: int = DEFAULT_OUTPUT_BYTES // KIB
    max_max_file_size: int = MAX_OUTPUT_BYTES // KIB
    number_of_runs: int = 1
    max_number_of_runs: int = 1
    redirect_stderr_to_stdout: bool = False
    max_extract_size: int
    enable_batched_submissions: bool = True
    max_submission_batch_size: int
    submission_cache_duration: float = 0.0
    use_docs_as_homepage: bool = False
    allow_enable_network: bool = False
    enable_network: bool = False


def config_for(tenant: Tenant, settings: GatewaySettings) -> Judge0Config:
    """The tenant's limits in Judge0's terms: its time limits in seconds (one wall-clock limit in
    sandpod), memory in KB; submissions beyond its maxConcurrent wait in its queue."""
    defaults = default_limits(tenant, settings)
    max_seconds = float(tenant.limits.max_timeout_seconds)
    return Judge0Config(
        enable_callbacks=bool(settings.judge0_callback_hosts),
        max_queue_size=settings.judge0_queue_size,
        max_submission_batch_size=settings.judge0_max_batch_size,
        cpu_time_limit=float(defaults.timeout_seconds),
        max_cpu_time_limit=max_seconds,
        max_cpu_extra_time=max_seconds,
        wall_time_limit=float(defaults.timeout_seconds),
        max_wall_time_limit=max_seconds,
        memory_limit=int(parse_quantity(defaults.memory) // KIB),
        max_memory_limit=int(parse_quantity(tenant.limits.max_memory) // KIB),
        max_extract_size=extract_limit(settings.max_code_bytes) // KIB,
    )


class SubmissionRequest(BaseModel):
    """A submission as POST /submissions takes it (fields Judge0 does not permit are ignored,
    as Rails' strong parameters drop them)."""

    model_config = ConfigDict(extra="ignore")

    source_code: str | None = None
    language_id: int | None = None
    compiler_options: str | None = None
    command_line_arguments: str | None = None
    number_of_runs: int | None = None
    stdin: str | None = None
    expected_output: str | None = None
    cpu_time_limit: float | None = None
    cpu_extra_time: float | None = None
    wall_time_limit: float | None = None
    memory_limit: float | None = None
    stack_limit: int | None = None
    max_processes_and_or_threads: int | None = None
    enable_per_process_and_thread_time_limit: bool | None = None
    enable_per_process_and_thread_memory_limit: bool | None = None
    max_file_size: int | None = None
    redirect_stderr_to_stdout: bool | None = None
    callback_url: str | None = None
    additional_files: str | None = None
    enable_network: bool | None = None


class SubmissionRecord(BaseModel):
    """What the execution keeps of its submission (the annotation), with defaults applied."""

    language_id: int
    expected_output: str | None = None
    cpu_time_limit: float
    cpu_extra_time: float
    wall_time_limit: float
    memory_limit: int
    max_file_size: int
    command_line_arguments: str | None = None
    callback_url: str | None = None


@dataclass(frozen=True)
class Translated:
    request: CreateExecutionRequest
    record: SubmissionRecord

    def annotations(self) -> dict[str, str]:
        return {SUBMISSION_ANNOTATION: self.record.model_dump_json(exclude_none=True)}


def validation_errors(exc: ValidationError, rename: Mapping[str, str] | None = None) -> Errors:
    """Pydantic's errors per (Judge0) field."""
    errors: Errors = {}
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "base"
        field = (rename or {}).get(field, field)
        errors.setdefault(field, []).append(str(error["msg"]))
    return errors


def parse_submission(data: object) -> SubmissionRequest:
    """One submission of a request body; InvalidSubmission when it is not an object of the
    right types."""
    try:
        return SubmissionRequest.model_validate(data)
    except ValidationError as exc:
        raise InvalidSubmission(validation_errors(exc)) from exc


def ruby_decode64(text: str) -> bytes:
    """Ruby's Base64.decode64, which Judge0 uses: characters outside the alphabet are skipped."""
    alphabet = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    data = bytes(c for c in text.encode("ascii", "ignore") if c in alphabet)
    data = data[: len(data) - len(data) % 4 if len(data) % 4 == 1 else len(data)]
    return base64.b64decode(data + b"=" * (-len(data) % 4))


def ruby_encode64(data: bytes) -> str:
    """Ruby's Base64.encode64, which Judge0 answers with: 60 characters a line, each ending
    with a newline."""
    return "".join(
        base64.b64encode(data[i : i + 45]).decode() + "\n" for i in range(0, len(data), 45)
    )


class _Checker:
    """Collects a submission's errors per field, in Judge0's words."""

    def __init__(self) -> None:
        self.errors: Errors = {}

    def add(self, field: str, message: str) -> None:
        self.errors.setdefault(field, []).append(message)

    def between(self, field: str, value: float | None, low: float, high: float) -> None:
        if value is None:
            return
        if value < low:
            self.add(field, f"must be greater than or equal to {_number(low)}")
        elif value > high:
            self.add(field, f"must be less than or equal to {_number(high)}")

    def equal(self, field: str, value: float | None, fixed: int, why: str) -> None:
        if value is not None and value != fixed:
            self.add(field, f"must be equal to {fixed} ({why})")

    def disabled(self, field: str, value: object, message: str) -> None:
        if value not in (None, False, ""):
            self.add(field, message)

    def text(self, field: str, value: str | None, base64_encoded: bool) -> str | None:
        """A text field as the program gets it: decoded when sent base64-encoded; UTF-8."""
        if value is None or not base64_encoded:
            return value
        try:
            return ruby_decode64(value).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            self.add(field, "is not UTF-8 text once decoded (sandpod runs text programs)")
            return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def effective_timeout(cpu: float, extra: float, wall: float) -> int:
    """sandpod's one wall-clock limit for Judge0's three: the soonest Judge0 would stop a
    program that keeps one CPU busy (cpu_time_limit 0 is no CPU limit in isolate)."""
    limit = wall if cpu == 0 else min(wall, cpu + extra)
    return max(MIN_TIMEOUT_SECONDS, math.ceil(limit))


# What reading a member of a hostile archive may raise (encrypted: RuntimeError; corrupt
# compressed data: zlib.error).
UNZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    NotImplementedError,
    RuntimeError,
    OSError,
    EOFError,
    zlib.error,
)


def extract_limit(max_code_bytes: int) -> int:
    """Bytes additional_files may extract to: the files travel base64-encoded in the spec,
    where they count against the gateway's max_code_bytes."""
    return max_code_bytes * 3 // 4


def unzip_files(encoded: str, max_bytes: int) -> list[FileInput]:
    """additional_files (a base64 zip) as the execution's files; ValueError saying why not."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(ruby_decode64(encoded)))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, binascii.Error, ValueError) as exc:
        raise ValueError("is not a base64-encoded zip archive") from exc
    entries = [entry for entry in archive.infolist() if not entry.is_dir()]
    if len(entries) > MAX_FILES:
        raise ValueError(f"holds {len(entries)} files; at most {MAX_FILES}")
    if sum(entry.file_size for entry in entries) > max_bytes:
        raise ValueError(f"extracts to more than {max_bytes // KIB} KB")
    files = []
    for entry in entries:
        try:
            with archive.open(entry) as member:
                content = member.read(max_bytes + 1)
        except UNZIP_ERRORS as exc:
            raise ValueError(f"cannot be extracted ({entry.filename}: {exc})") from exc
        if len(content) > max_bytes:
            raise ValueError(f"extracts to more than {max_bytes // KIB} KB")
        try:
            files.append(
                FileInput(path=entry.filename, content_base64=base64.b64encode(content).decode())
            )
        except ValidationError as exc:
            raise ValueError(f"has a file sandpod cannot place: {entry.filename!r}") from exc
    return files


def translate(
    body: SubmissionRequest,
    *,
    base64_encoded: bool,
    config: Judge0Config,
    catalog: LanguageCatalog,
    max_code_bytes: int,
    callback_hosts: Sequence[str] = (),
) -> Translated:
    """The execution request for a submission, and what to keep of it; InvalidSubmission with
    Judge0's errors for what Judge0 would refuse and what sandpod cannot honour."""
    check = _Checker()
    source = check.text("source_code", body.source_code, base64_encoded)
    stdin = check.text("stdin", body.stdin, base64_encoded)
    expected = check.text("expected_output", body.expected_output, base64_encoded)
    if body.source_code is None or (source is not None and not source.strip()):
        check.add("source_code", "can't be blank")
    language = _language(check, body.language_id, catalog)
    if expected is not None and len(expected) > MAX_EXPECTED_OUTPUT_CHARS:
        check.add(
            "expected_output", f"is too long (maximum is {MAX_EXPECTED_OUTPUT_CHARS} characters)"
        )
    check.between("number_of_runs", body.number_of_runs, 1, config.max_number_of_runs)
    check.between("cpu_time_limit", body.cpu_time_limit, 0, config.max_cpu_time_limit)
    check.between("cpu_extra_time", body.cpu_extra_time, 0, config.max_cpu_extra_time)
    check.between("wall_time_limit", body.wall_time_limit, 1, config.max_wall_time_limit)
    min_memory_kb = int(parse_quantity(MEMORY_BOUNDS.minimum) // KIB)
    check.between("memory_limit", body.memory_limit, min_memory_kb, config.max_memory_limit)
    check.equal("stack_limit", body.stack_limit, STACK_LIMIT_KB, "the sandbox's, not set per run")
    check.equal(
        "max_processes_and_or_threads",
        body.max_processes_and_or_threads,
        PROCESS_LIMIT,
        "the sandbox's, not set per run",
    )
    for flag in (
        "enable_per_process_and_thread_time_limit",
        "enable_per_process_and_thread_memory_limit",
        "redirect_stderr_to_stdout",
    ):
        check.disabled(flag, getattr(body, flag), "this option cannot be enabled")
    check.between(
        "max_file_size", body.max_file_size, MIN_OUTPUT_BYTES // KIB, config.max_max_file_size
    )
    check.disabled(
        "compiler_options", body.compiler_options, "setting compiler options is not allowed"
    )
    if body.callback_url:
        problem = callback_problem(body.callback_url, callback_hosts)
        if problem is not None:
            check.add("callback_url", problem)
    check.disabled("enable_network", body.enable_network, "enabling network is not allowed")
    args = _arguments(check, body.command_line_arguments)
    files: list[FileInput] = []
    if body.additional_files:
        try:
            files = unzip_files(body.additional_files, extract_limit(max_code_bytes))
        except ValueError as exc:
            check.add("additional_files", str(exc))
    if check.errors or language is None or source is None or body.language_id is None:
        raise InvalidSubmission(check.errors)
    record = SubmissionRecord(
        language_id=body.language_id,
        expected_output=expected,
        cpu_time_limit=_or(body.cpu_time_limit, config.cpu_time_limit),
        cpu_extra_time=_or(body.cpu_extra_time, config.cpu_extra_time),
        wall_time_limit=_or(body.wall_time_limit, config.wall_time_limit),
        memory_limit=math.ceil(_or(body.memory_limit, config.memory_limit)),
        max_file_size=int(_or(body.max_file_size, config.max_file_size)),
        command_line_arguments=body.command_line_arguments,
        callback_url=body.callback_url or None,
    )
    try:
        request = CreateExecutionRequest(
            language=language,
            code=source,
            stdin=stdin,
            args=args,
            files=files,
            timeout_seconds=effective_timeout(
                record.cpu_time_limit, record.cpu_extra_time, record.wall_time_limit
            ),
            memory=f"{record.memory_limit}Ki",
            max_output_bytes=record.max_file_size * KIB,
        )
    except ValidationError as exc:
        raise InvalidSubmission(validation_errors(exc, REQUEST_FIELDS)) from exc
    return Translated(request, record)


# sandpod's request fields -> Judge0's, for errors the execution request finds.
REQUEST_FIELDS = {
    "code": "source_code",
    "args": "command_line_arguments",
    "files": "additional_files",
    "timeout_seconds": "wall_time_limit",
    "memory": "memory_limit",
    "max_output_bytes": "max_file_size",
}


def callback_problem(url: str, hosts: Sequence[str]) -> str | None:
    """Why the gateway may not PUT a result to `url`, or None: http(s) to a host (or host:port)
    the platform allows."""
    if not hosts:
        return "setting callback is not allowed"
    if len(url) > MAX_CALLBACK_URL_CHARS:
        return f"is too long (maximum is {MAX_CALLBACK_URL_CHARS} characters)"
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return "is not a URL"
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        return "must be an http or https URL"
    allowed = {entry.lower() for entry in hosts}
    if host not in allowed and f"{host}:{port}" not in allowed:
        return f"host {host}:{port} is not allowed for callbacks"
    return None


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _language(check: _Checker, language_id: int | None, catalog: LanguageCatalog) -> str | None:
    if language_id is None:
        check.add("language_id", "can't be blank")
        return None
    name = LANGUAGE_IDS.get(language_id)
    if name is None or catalog.get(name) is None:
        check.add("language_id", f"language with id {language_id} doesn't exist")
        return None
    return name


def _arguments(check: _Checker, line: str | None) -> list[str]:
    """command_line_arguments as the program's arguments: Judge0 removes $&;<>|` and lets its
    run script's shell split the rest into words (quotes group them)."""
    if line is None:
        return []
    if len(line) > MAX_OPTION_CHARS:
        check.add(
            "command_line_arguments", f"is too long (maximum is {MAX_OPTION_CHARS} characters)"
        )
        return []
    try:
        args = shlex.split(line.strip().translate(SHELL_CONTROL))
    except ValueError:
        check.add("command_line_arguments", "cannot be split into arguments (unbalanced quotes)")
        return []
    if len(args) > MAX_ARGS:
        check.add("command_line_arguments", f"has {len(args)} arguments; at most {MAX_ARGS}")
    return args


def languages(catalog: LanguageCatalog) -> list[dict[str, Any]]:
    """GET /languages: id and name of each language the catalog has, by name."""
    return [
        {"id": language_id, "name": name}
        for language_id, name in sorted(language_names(catalog).items(), key=lambda i: i[1])
    ]


def all_languages(catalog: LanguageCatalog) -> list[dict[str, Any]]:
    """GET /languages/all: Judge0 adds its archived languages (kept for old submissions, no
    longer run); sandpod keeps none: the languages it runs, each with is_archived false."""
    return [{**entry, "is_archived": False} for entry in languages(catalog)]


def language_names(catalog: LanguageCatalog) -> dict[int, str]:
    names = {}
    for language_id, language in LANGUAGE_IDS.items():
        info = catalog.get(language)
        if info is not None:
            names[language_id] = LANGUAGE_NAMES[language].format(version=info.version or "")
    return names


def language(catalog: LanguageCatalog, language_id: int) -> dict[str, Any] | None:
    """GET /languages/{id}: the language, or None when the catalog does not have it."""
    name = language_names(catalog).get(language_id)
    if name is None:
        return None
    return {
        "id": language_id,
        "name": name,
        "is_archived": False,
        "source_file": None,
        "compile_cmd": None,
        "run_cmd": None,
    }


def statuses() -> list[dict[str, Any]]:
    return [{"id": int(s), "description": STATUS_DESCRIPTIONS[s]} for s in Status]


def about() -> dict[str, str]:
    return {
        "version": JUDGE0_VERSION,
        "homepage": "https://github.com/sandpod/sandpod",
        "source_code": "https://github.com/sandpod/sandpod",
        "maintainer": "sandpod (Judge0 CE 1.13.1's API over sandpod executions)",
    }


def requested_fields(fields: str | None) -> tuple[str, ...]:
    """?fields=: the fields to answer with (`*` all; none: the default eight)."""
    names = [name for name in (fields or "").split(",") if name]
    invalid = [name for name in names if name != "*" and name not in ALL_FIELDS]
    if invalid:
        raise InvalidFields(invalid)
    if "*" in names:
        return ALL_FIELDS
    return tuple(names) or DEFAULT_FIELDS


def judge0_strip(text: str | None) -> str | None:
    """How Judge0 compares outputs (IsolateJob#strip): trailing whitespace off every line and off
    the whole; no output is nil, which equals no expected output only."""
    if text is None:
        return None
    whitespace = " \t\n\v\f\r\0"
    return "\n".join(line.rstrip(whitespace) for line in text.split("\n")).rstrip(whitespace)


def verdict(result: ExecutionResult, expected_output: str | None) -> Status:
    """The Judge0 status of an execution, from what the runner observed and the platform
    decided."""
    status = result.status
    if status == ExecutionStatus.pending:
        return Status.IN_QUEUE
    if status == ExecutionStatus.running:
        return Status.PROCESSING
    if status == ExecutionStatus.compile_error:
        return Status.COMPILATION_ERROR
    if status in (ExecutionStatus.sandbox_error, ExecutionStatus.cancelled):
        return Status.INTERNAL_ERROR
    if result.stdout_truncated or result.stderr_truncated:
        # Judge0's file size limit stops the program (SIGXFSZ); sandpod's runner keeps running
        # it and drops what is over max_file_size (and the status keeps a tail), so there is
        # no whole output to judge.
        return Status.SIGXFSZ
    if status == ExecutionStatus.timeout:
        return Status.TIME_LIMIT_EXCEEDED
    if status == ExecutionStatus.error:
        if result.signal is not None:
            return SIGNAL_STATUSES.get(result.signal, Status.OTHER)
        if result.exit_code is None:
            # Killed by the platform without an exit code (out of memory): isolate sees a
            # signal it does not name.
            return Status.OTHER
        return Status.NZEC
    if expected_output is None or judge0_strip(expected_output) == judge0_strip(
        result.stdout or None
    ):
        return Status.ACCEPTED
    return Status.WRONG_ANSWER


def record_of(resource: Resource) -> SubmissionRecord | None:
    """The submission an execution was created for, if it was one."""
    annotations = (resource.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(SUBMISSION_ANNOTATION)
    if not isinstance(text, str):
        return None
    try:
        return SubmissionRecord.model_validate_json(text)
    except ValidationError:
        return None


def rails_time(moment: datetime | None) -> str | None:
    """A datetime as Rails writes it in JSON: UTC, milliseconds, Z."""
    if moment is None:
        return None
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def decimal_text(value: float | None) -> str | None:
    """A decimal column as Rails writes it in JSON: a string, trailing zeros dropped."""
    if value is None:
        return None
    text = f"{value:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _seconds(milliseconds: int | None) -> str | None:
    return None if milliseconds is None else decimal_text(milliseconds / 1000)


def submission_view(
    resource: Resource,
    fields: tuple[str, ...],
    base64_encoded: bool,
    names: Mapping[int, str],
) -> dict[str, Any]:
    """The execution as a Judge0 submission, with `fields` only (`names`: language_names)."""
    result = execution_result(resource)
    spec = resource.get("spec") or {}
    record = record_of(resource)
    expected = record.expected_output if record else None
    status = verdict(result, expected)
    ran = status not in (Status.IN_QUEUE, Status.PROCESSING, Status.COMPILATION_ERROR)
    runtime = ran and status != Status.INTERNAL_ERROR
    language_id = record.language_id if record else _language_id(result.language)
    values: dict[str, Any] = {
        "source_code": spec.get("source"),
        "language_id": language_id,
        "stdin": spec.get("stdin"),
        "expected_output": expected,
        "stdout": (result.stdout or None) if ran else None,
        "status_id": int(status),
        "created_at": rails_time(result.created_at),
        "finished_at": rails_time(result.finished_at),
        "time": _seconds(result.execution_time_ms) if runtime else None,
        "memory": _kilobytes(result.peak_memory_bytes) if runtime else None,
        "stderr": (result.stderr or None) if ran else None,
        "token": result.id,
        "number_of_runs": 1,
        "cpu_time_limit": decimal_text(record.cpu_time_limit) if record else None,
        "cpu_extra_time": decimal_text(record.cpu_extra_time) if record else None,
        "wall_time_limit": decimal_text(record.wall_time_limit) if record else None,
        "memory_limit": record.memory_limit if record else None,
        "stack_limit": STACK_LIMIT_KB,
        "max_processes_and_or_threads": PROCESS_LIMIT,
        "enable_per_process_and_thread_time_limit": False,
        "enable_per_process_and_thread_memory_limit": False,
        "max_file_size": record.max_file_size if record else None,
        "compile_output": result.compile_output or None,
        # Judge0 reports 0 when isolate saw no exit code (a signal, a timeout).
        "exit_code": (result.exit_code or 0) if runtime else None,
        "exit_signal": result.signal if runtime else None,
        "message": _message(status, read_status(resource, CodeExecutionStatus)),
        "wall_time": _seconds(result.execution_time_ms) if runtime else None,
        "compiler_options": None,
        "command_line_arguments": record.command_line_arguments if record else None,
        "redirect_stderr_to_stdout": False,
        "callback_url": record.callback_url if record else None,
        "additional_files": None,
        "enable_network": False,
        "status": {"id": int(status), "description": STATUS_DESCRIPTIONS[status]},
        "language": {"id": language_id, "name": names.get(language_id or 0, result.language)},
    }
    # Judge0 sends its message base64-encoded too (the client decodes only the others).
    encoded = (*ENCODED_FIELDS, "message") if base64_encoded else ()
    return {name: _encoded(values[name]) if name in encoded else values[name] for name in fields}


def _encoded(value: str | None) -> str | None:
    return ruby_encode64(value.encode()) if value else value


def _language_id(language: str) -> int | None:
    return next((i for i, name in LANGUAGE_IDS.items() if name == language), None)


def _kilobytes(size: int | None) -> int | None:
    return None if size is None else -(-size // KIB)


def _message(status: Status, st: CodeExecutionStatus | None) -> str | None:
    """What the platform says happened (never the program's words), where Judge0 has
    isolate's or its own message."""
    if status == Status.SIGXFSZ:
        return (
            "Output exceeded max_file_size or what the execution's status keeps; "
            "the rest was dropped"
        )
    quiet = (Status.IN_QUEUE, Status.PROCESSING, Status.ACCEPTED, Status.WRONG_ANSWER)
    if status in quiet or status == Status.COMPILATION_ERROR or st is None:
        return None
    if status == Status.INTERNAL_ERROR:
        return ": ".join(part for part in (st.reason, st.message) if part) or None
    return st.message or None
