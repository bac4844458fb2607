"""Files in a live session, moved as executions in it: an upload is a run whose files carry
the file and whose program does nothing; a download is a run that prints the file
base64-encoded, decoded here. Both queue with the session's other runs.

The programs are per language and bind no names, so the variables of a session whose
interpreter keeps them (Python, JavaScript, TypeScript) are left as they were.
"""

import base64
import binascii
import json
import math

from pydantic import BaseModel, Field, ValidationError

from sandpod_gateway.kube.resources import Resource
from sandpod_gateway.schemas import ExecutionStatus, FileInput, SessionExecutionRequest
from sandpod_gateway.usecases.executions import CreateOutcome
from sandpod_gateway.usecases.sessions import SessionContext, live_session, run_in_session
from sandpod_gateway.web.errors import ErrorDetail, GatewayError

# Exit status of a download program when the path is not a regular file.
MISSING_FILE_EXIT = 3

NO_OP_PROGRAMS = {"python": "pass", "bash": ":", "javascript": ";", "typescript": ";"}

# Valid TypeScript as well (the parameter's type is not checked); `require` is there in a
# session's node kernel and in a CommonJS main.js or main.ts.
NODE_DOWNLOAD_PROGRAM = (
    "(p => { const fs = require('fs');"
    " if (!fs.existsSync(p) || !fs.statSync(p).isFile()) { process.exitCode = 3; return; }"
    " process.stdout.write(fs.readFileSync(p).toString('base64')); })({path});"
)
# `{path}` is a JSON string literal, valid in each of these languages.
DOWNLOAD_PROGRAMS = {
    "python": "(lambda p: print(__import__('base64').b64encode(open(p, 'rb').read()).decode())"
    " if __import__('os').path.isfile(p) else __import__('sys').exit(3))({path})",
    "bash": 'p={path}; if [ -f "$p" ]; then base64 -w0 -- "$p"; else exit 3; fi',
    "javascript": NODE_DOWNLOAD_PROGRAM,
    "typescript": NODE_DOWNLOAD_PROGRAM,
}


class FileInfo(BaseModel):
    path: str
    size: int = Field(description="Bytes")
    execution_id: str = Field(description="The execution that moved the file (audit)")


def _program(table: dict[str, str], language: str) -> str:
    program = table.get(language)
    if program is None:
        raise GatewayError(
            400,
            "files_not_supported",
            f"File transfer is not available in {language} sessions; "
            f"it is in: {', '.join(sorted(table))}.",
        )
    return program


def _too_large(size: int | str, limit: int) -> GatewayError:
    return GatewayError(
        413,
        "file_too_large",
        f"The file has {size} bytes; this tenant moves files of at most {limit} bytes.",
        [ErrorDetail(field="body", message="too large", type="max_file_bytes", limit=limit)],
    )


def _invalid_path(exc: ValidationError) -> GatewayError:
    return GatewayError(
        422,
        "invalid_path",
        "The path must be relative, without '..' or segments starting with a dot.",
        [ErrorDetail(field="path.path", message=str(exc.errors()[0]["msg"]), type="path")],
    )


def _failed(outcome: CreateOutcome, what: str) -> GatewayError:
    result = outcome.result
    return GatewayError(
        409 if result.status != ExecutionStatus.sandbox_error else 503,
        f"{what}_failed",
        f"The {what} did not complete ({result.status.value}): "
        f"{result.error_message or 'no detail'}",
        [ErrorDetail(message=f"execution {result.id}", type="execution")],
    )


async def upload_file(
    session_id: str,
    path: str,
    data: bytes,
    ctx: SessionContext,
    *,
    binary: bool = False,
    session: Resource | None = None,
) -> FileInfo:
    """Write `data` to `path` in the session's work directory: UTF-8 text, or any bytes
    when `binary` (they travel base64-encoded). `session`: the caller's read of it, if any."""
    limit = ctx.tenant.limits.max_file_bytes
    if len(data) > limit:
        raise _too_large(len(data), limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not binary:
            raise GatewayError(
                415, "not_text", "Uploads carry UTF-8 text (downloads may be any bytes)."
            ) from exc
        text = None
    session = session or await live_session(session_id, ctx)
    try:
        file = (
            FileInput(path=path, content=text)
            if text is not None
            else FileInput(path=path, content_base64=base64.b64encode(data).decode())
        )
    except ValidationError as exc:
        raise _invalid_path(exc) from exc
    language = str((session.get("spec") or {}).get("language", ""))
    body = SessionExecutionRequest(code=_program(NO_OP_PROGRAMS, language), files=[file])
    outcome = await run_in_session(
        session_id, body, ctx, idempotency_key=None, wait=True, session=session
    )
    if outcome.result.status != ExecutionStatus.success:
        raise _failed(outcome, "upload")
    return FileInfo(path=path, size=len(data), execution_id=outcome.result.id)


async def download_file(
    session_id: str, path: str, ctx: SessionContext, *, session: Resource | None = None
) -> bytes:
    """The bytes of `path` in the session's work directory (`session`: as upload_file)."""
    try:
        FileInput(path=path, content="")
    except ValidationError as exc:
        raise _invalid_path(exc) from exc
    session = session or await live_session(session_id, ctx)
    language = str((session.get("spec") or {}).get("language", ""))
    program = _program(DOWNLOAD_PROGRAMS, language).replace("{path}", json.dumps(path))
    limit = ctx.tenant.limits.max_file_bytes
    body = SessionExecutionRequest(
        code=program, max_output_bytes=max(1024, 4 * math.ceil(limit / 3) + 64)
    )
    outcome = await run_in_session(
        session_id, body, ctx, idempotency_key=None, wait=True, session=session
    )
    result = outcome.result
    if result.status == ExecutionStatus.error and result.exit_code == MISSING_FILE_EXIT:
        raise GatewayError(404, "file_not_found", f"No file {path!r} in the session")
    if result.status != ExecutionStatus.success:
        raise _failed(outcome, "download")
    if result.stdout_truncated:
        raise _too_large(f"more than {limit}", limit)
    try:
        data = base64.b64decode(result.stdout.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _failed(outcome, "download") from exc
    if len(data) > limit:
        raise _too_large(len(data), limit)
    return data
