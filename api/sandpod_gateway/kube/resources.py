"""Pure translation between the gateway's HTTP shapes and CodeExecution resources."""

import base64
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sandpod_contract.models import (
    COMPILATION_ERROR,
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_MAX_LIFETIME_SECONDS,
    DEFAULT_OUTPUT_BYTES,
    TERMINAL_PHASES,
    CodeExecutionSpec,
    CodeExecutionStatus,
    CodeSessionSpec,
    CodeSessionStatus,
    LintRules,
    OutputFileStatus,
    Resources,
    SourceFile,
    parse_time,
)
from sandpod_contract.names import (
    API_VERSION,
    KIND,
    QUEUED_LABEL,
    REQUEST_HASH_ANNOTATION,
    SESSION_KIND,
    TENANT_LABEL,
)

from sandpod_gateway.schemas import (
    CreateExecutionRequest,
    CreateSessionRequest,
    ExecutionResult,
    ExecutionStatus,
    FileInput,
    FileOutput,
    LintDiagnostic,
    SessionInfo,
    SessionStatus,
)
from sandpod_gateway.usecases.tracebacks import uncaught_exception_note
from sandpod_gateway.web.errors import ErrorDetail, GatewayError, format_location

PHASE_STATUS: dict[str, ExecutionStatus] = {
    "Pending": ExecutionStatus.pending,
    "Running": ExecutionStatus.running,
    "Succeeded": ExecutionStatus.success,
    "Failed": ExecutionStatus.error,
    "TimedOut": ExecutionStatus.timeout,
    "Cancelled": ExecutionStatus.cancelled,
    "Error": ExecutionStatus.sandbox_error,
}
# Spec field -> request field, for errors the spec model finds.
REQUEST_FIELDS = {
    "source": "code",
    "timeoutSeconds": "timeout_seconds",
    "maxOutputBytes": "max_output_bytes",
}

Resource = dict[str, Any]


def request_fingerprint(request: BaseModel, session: str | None = None) -> str:
    """Hash of the request as sent (and the session it is for), to tell a true retry from a
    reused Idempotency-Key."""
    canonical = request.model_dump_json(exclude_unset=True)
    if session is not None:
        canonical = f"{session}\n{canonical}"
    return hashlib.sha256(canonical.encode()).hexdigest()


def _invalid_spec(exc: ValidationError) -> GatewayError:
    return GatewayError(
        422,
        "invalid_request",
        "The request is not valid; see details.",
        [
            ErrorDetail(
                field=_spec_error_field(tuple(error["loc"])),
                message=error["msg"],
                type=error["type"],
            )
            for error in exc.errors()
        ],
    )


def _manifest(kind: str, name: str, tenant: str, fingerprint: str, spec: BaseModel) -> Resource:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {
            "name": name,
            "labels": {TENANT_LABEL: tenant, "app.kubernetes.io/created-by": "sandpod-gateway"},
            "annotations": {REQUEST_HASH_ANNOTATION: fingerprint},
        },
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def _source_file(file: FileInput) -> SourceFile:
    if file.content_base64 is not None:
        return SourceFile(path=file.path, content=file.content_base64, encoding="base64")
    return SourceFile(path=file.path, content=file.content or "")


def _spec_error_field(location: tuple[int | str, ...]) -> str:
    head, *rest = location or ("spec",)
    return format_location(("body", REQUEST_FIELDS.get(str(head), str(head)), *rest))


def queued(manifest: Resource, max_concurrent: int) -> Resource:
    """The execution to create waiting for its tenant's turn: the operator starts it once
    fewer than `max_concurrent` of the tenant's executions run (the label's value)."""
    metadata = manifest["metadata"]
    labels = {**(metadata.get("labels") or {}), QUEUED_LABEL: str(max_concurrent)}
    return {**manifest, "metadata": {**metadata, "labels": labels}}


def build_code_execution(
    *,
    name: str,
    tenant: str,
    request: CreateExecutionRequest,
    timeout_seconds: int,
    memory: str | None,
    cpu: str | None,
    ttl_seconds_after_finished: int,
    session: str | None = None,
    lint: LintRules | None = None,
) -> Resource:
    """The CodeExecution manifest for a request with its limits resolved (in a session:
    memory and cpu None, the session's apply).

    The spec goes through the CRD's own model, so what it refuses is a 422 here
    rather than a round trip to the API server.
    """
    try:
        spec = CodeExecutionSpec(
            language=request.language,
            source=request.code,
            files=[_source_file(f) for f in request.files],
            stdin=request.stdin,
            args=request.args,
            mode=request.mode,
            lint=lint,
            timeout_seconds=timeout_seconds,
            resources=Resources(memory=memory, cpu=cpu),
            network=request.network_spec(),
            ttl_seconds_after_finished=ttl_seconds_after_finished,
            max_output_bytes=request.max_output_bytes or DEFAULT_OUTPUT_BYTES,
            session=session,
        )
    except ValidationError as exc:
        raise _invalid_spec(exc) from exc
    return _manifest(KIND, name, tenant, request_fingerprint(request, session), spec)


def build_code_session(
    *, name: str, tenant: str, request: CreateSessionRequest, spec: CodeSessionSpec
) -> Resource:
    """The CodeSession manifest for a request, its spec resolved by admission."""
    return _manifest(SESSION_KIND, name, tenant, request_fingerprint(request), spec)


def phase(resource: Resource) -> str | None:
    value = (resource.get("status") or {}).get("phase")
    return value if isinstance(value, str) else None


def is_terminal(resource: Resource) -> bool:
    return phase(resource) in TERMINAL_PHASES


def belongs_to(resource: Resource, tenant: str) -> bool:
    labels = (resource.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(TENANT_LABEL) == tenant)


def execution_status(resource: Resource) -> ExecutionStatus:
    status = PHASE_STATUS.get(phase(resource) or "Pending", ExecutionStatus.pending)
    reason = (resource.get("status") or {}).get("reason")
    if status == ExecutionStatus.error and reason == COMPILATION_ERROR:
        return ExecutionStatus.compile_error
    return status


def _without(data: Resource, location: tuple[int | str, ...]) -> Resource:
    """`data` without what `location` points at: a list item, else a whole field."""
    key, *rest = location
    value = data.get(str(key))
    if rest and isinstance(rest[0], int) and isinstance(value, list):
        return {**data, str(key): [item for i, item in enumerate(value) if i != rest[0]]}
    return {name: item for name, item in data.items() if name != key}


StatusModel = TypeVar("StatusModel", bound=BaseModel)


def read_status(resource: Resource, model: type[StatusModel]) -> StatusModel | None:
    """The status through its model, leniently: a status this gateway version does not fully
    understand must still give an answer, never a 500, so what does not fit is left out."""
    data = resource.get("status")
    if not isinstance(data, dict):
        return None
    while True:
        try:
            # Strict, from JSON: a string is not a number, a number is not a flag.
            return model.model_validate_json(json.dumps(data), strict=True)
        except ValidationError as exc:
            location = next((e["loc"] for e in exc.errors() if e["loc"]), None)
            smaller = _without(data, location) if location and location[0] != "phase" else data
            if smaller == data:
                return None
            data = smaller


def error_message(
    status: ExecutionStatus, st: CodeExecutionStatus, timeout_seconds: object, language: str
) -> str | None:
    """What went wrong, in one sentence an agent can act on; for a Python program that
    ended with an uncaught exception, its name and message, quoted from its stderr."""
    message, reason = st.message or None, st.reason or None
    if status == ExecutionStatus.error:
        if reason == "OOMKilled":
            return message or "The program ran out of memory and was killed"
        if st.signal is not None:
            return message or f"The program was killed by signal {st.signal}"
        exited = message or f"The program exited with code {st.exit_code}"
        note = uncaught_exception_note(language, st.exit_code, st.stderr or "")
        return exited if note is None else f"{exited}; {note}"
    if status == ExecutionStatus.compile_error:
        return message or "The program did not build; see compile_output"
    if status == ExecutionStatus.timeout:
        return message or (
            f"The program exceeded its time limit of {timeout_seconds} s and was killed"
        )
    if status == ExecutionStatus.cancelled:
        return message or "The execution was cancelled"
    if status == ExecutionStatus.sandbox_error:
        return ": ".join(part for part in (reason, message) if part) or "The sandbox failed"
    return None


def created_at(resource: Resource) -> datetime | None:
    """When the API server created the object, if its metadata says so readably."""
    return parse_time((resource.get("metadata") or {}).get("creationTimestamp"))


def output_file(resource: Resource, path: str) -> OutputFileStatus | None:
    """The status entry of an output file, by its path."""
    st = read_status(resource, CodeExecutionStatus)
    return next((o for o in (st.outputs if st else None) or [] if o.path == path), None)


def stored_outputs(resource: Resource) -> str | None:
    """The ConfigMap holding the stored output files, if any are."""
    st = read_status(resource, CodeExecutionStatus)
    if st is None or not any(o.stored for o in st.outputs or []):
        return None
    return st.outputs_config_map


def output_files(
    st: CodeExecutionStatus, contents: Mapping[str, bytes], inline_bytes: int
) -> list[FileOutput]:
    """The output files, their content inline (from `contents`, by key) while the total
    stays within `inline_bytes`."""
    files = []
    for entry in st.outputs or []:
        content = contents.get(entry.key or "") if entry.stored else None
        inline = content is not None and len(content) <= inline_bytes
        if inline and content is not None:
            inline_bytes -= len(content)
        else:
            content = None
        files.append(
            FileOutput(
                path=entry.path,
                size=entry.size,
                media_type=entry.media_type,
                sha256=entry.sha256,
                stored=entry.stored,
                content_base64=None if content is None else base64.b64encode(content).decode(),
            )
        )
    return files


def execution_result(
    resource: Resource, contents: Mapping[str, bytes] | None = None, inline_bytes: int = 0
) -> ExecutionResult:
    """The agent-facing view of a CodeExecution; output files inline from `contents` (the
    outputs ConfigMap's binaryData, decoded) up to `inline_bytes`."""
    metadata = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    st = read_status(resource, CodeExecutionStatus) or CodeExecutionStatus(phase="Pending")
    status = execution_status(resource)
    return ExecutionResult(
        id=str(metadata.get("name", "")),
        status=status,
        language=str(spec.get("language", "")),
        mode=str(spec.get("mode") or "run"),
        stdout=st.stdout or "",
        stderr=st.stderr or "",
        exit_code=st.exit_code,
        signal=st.signal,
        execution_time_ms=st.duration_ms,
        peak_memory_bytes=st.peak_memory_bytes,
        error_message=error_message(
            status, st, spec.get("timeoutSeconds"), str(spec.get("language", ""))
        ),
        reason=st.reason or None,
        retryable=st.retryable,
        stdout_truncated=st.stdout_truncated is True,
        stderr_truncated=st.stderr_truncated is True,
        diagnostics=None
        if st.diagnostics is None
        else [LintDiagnostic.of(found) for found in st.diagnostics],
        compile_output=st.compile_output,
        compile_output_truncated=st.compile_output_truncated is True,
        files=output_files(st, contents or {}, inline_bytes),
        files_truncated=st.outputs_truncated is True,
        egress_blocked=st.egress_blocked,
        created_at=created_at(resource),
        started_at=st.started_at,
        finished_at=st.finished_at,
        session=spec.get("session"),
        result=st.result,
        state_lost=st.state_lost is True,
        reported_by=st.reported_by,
    )


def session_status(st: CodeSessionStatus | None) -> SessionStatus:
    return SessionStatus(st.phase.lower()) if st is not None else SessionStatus.starting


def is_ended(resource: Resource) -> bool:
    st = read_status(resource, CodeSessionStatus)
    return st is not None and st.phase == "Ended"


def session_info(resource: Resource) -> SessionInfo:
    """The agent-facing view of a CodeSession (its spec read leniently, like the status)."""
    metadata = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    resources = spec.get("resources") or {}
    st = read_status(resource, CodeSessionStatus)
    return SessionInfo(
        id=str(metadata.get("name", "")),
        status=session_status(st),
        language=str(spec.get("language", "")),
        reason=st.reason if st else None,
        message=st.message if st else None,
        memory=resources.get("memory"),
        cpu=resources.get("cpu"),
        idle_timeout_seconds=spec.get("idleTimeoutSeconds") or DEFAULT_IDLE_TIMEOUT_SECONDS,
        max_lifetime_seconds=spec.get("maxLifetimeSeconds") or DEFAULT_MAX_LIFETIME_SECONDS,
        execution_count=st.execution_count if st else 0,
        start_mode=st.start_mode if st else None,
        created_at=created_at(resource),
        started_at=st.started_at if st else None,
        last_activity_at=st.last_activity_at if st else None,
        expires_at=st.expires_at if st else None,
    )
