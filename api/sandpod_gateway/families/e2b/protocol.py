"""E2B's wire shapes, translated from and to sandpod's: pure functions, no I/O.

A sandbox is a CodeSession: its E2B id is the session's name. Each sandbox's access token
(E2B's envdAccessToken, sent back as X-Access-Token or E2B-Traffic-Access-Token) is derived,
never stored: `<tenant>.<uid>.<HMAC-SHA256(key, tenant/sandbox/uid)>`, the uid the session's,
so the data plane finds the tenant and checks the token before reading anything, a connect can
hand it out again, and a sandbox created again under the same id (a new uid) refuses it.
"""

import hashlib
import hmac
import json
import re
import textwrap
import time
import urllib.parse
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sandpod_contract.models import MAX_CONTENT_CHARS, parse_time
from sandpod_contract.names import GROUP, SESSION_END_ANNOTATION

from sandpod_gateway.kube.resources import Resource, created_at, session_info
from sandpod_gateway.schemas import ExecutionResult, ExecutionStatus, SessionStatus

TEMPLATES = {"code-interpreter-v1": "python", "base": "python"}
DEFAULT_TIMEOUT_SECONDS = 300
# The envd version the SDK is told: it picks its request shapes by it (0.5.7: uploads as
# application/octet-stream, 0.4.0: a default user), so it is the oldest whose shapes we serve.
ENVD_VERSION = "0.5.7"
CLIENT_ID = "sandpod"
DEFAULT_CONTEXT = "default"
HOME = "/home/user"

FAMILY_LABEL = f"{GROUP}/api-family"
TEMPLATE_ANNOTATION = f"{GROUP}/e2b-template"
METADATA_ANNOTATION = f"{GROUP}/e2b-metadata"
# E2B's end of a sandbox: the operator ends the session then (and the gateway on a read).
END_ANNOTATION = SESSION_END_ANNOTATION
ENVS_ANNOTATION = f"{GROUP}/e2b-envs"
# When the sandbox was created, to the microsecond (creationTimestamp has whole seconds):
# E2B's startedAt, by which a list is ordered and filtered.
STARTED_ANNOTATION = f"{GROUP}/e2b-started-at"

# The code of one cell: what the gateway takes of a run's code (settings.max_code_bytes) is
# checked again when it is run.
MAX_CODE_CHARS = MAX_CONTENT_CHARS
MAX_METADATA_ENTRIES = 64
MAX_METADATA_CHARS = 16 * 1024
_TOKEN_LABEL = b"sandpod e2b access token\x00"
CONTEXT_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$")
_SANDBOX_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class E2bError(Exception):
    """An answer in E2B's error shape, {"code": status, "message": ...}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def template_language(template: str) -> str:
    language = TEMPLATES.get(template)
    if language is None:
        known = ", ".join(sorted(TEMPLATES))
        raise E2bError(404, f"template {template!r} not found; sandpod serves: {known}")
    return language


def checked_sandbox_id(sandbox_id: str) -> str:
    if not _SANDBOX_ID.match(sandbox_id):
        raise E2bError(404, f"sandbox {sandbox_id!r} not found")
    return sandbox_id


def access_token(key: bytes, tenant: str, sandbox_id: str, uid: str) -> str:
    """The token of the sandbox `sandbox_id` whose session has `uid`."""
    signed = f"{tenant}/{sandbox_id}/{uid}".encode()
    mac = hmac.new(key, _TOKEN_LABEL + signed, hashlib.sha256)
    return f"{tenant}.{uid}.{mac.hexdigest()}"


@dataclass(frozen=True)
class TokenClaim:
    """What a token names (not yet checked: see token_matches)."""

    tenant: str
    uid: str


def token_claim(token: str) -> TokenClaim:
    tenant, _, rest = token.partition(".")
    return TokenClaim(tenant, rest.partition(".")[0])


def token_matches(key: bytes, token: str, sandbox_id: str) -> bool:
    claim = token_claim(token)
    expected = access_token(key, claim.tenant, sandbox_id, claim.uid)
    return hmac.compare_digest(expected.encode(), token.encode())


def session_uid(session: Resource) -> str:
    return str((session.get("metadata") or {}).get("uid") or "")


def checked_metadata(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    found = dict(metadata or {})
    if len(found) > MAX_METADATA_ENTRIES:
        raise E2bError(400, f"metadata: at most {MAX_METADATA_ENTRIES} entries")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        raise E2bError(400, "metadata: keys and values must be strings")
    if len(json.dumps(found)) > MAX_METADATA_CHARS:
        raise E2bError(400, f"metadata: at most {MAX_METADATA_CHARS} characters in all")
    return found


def metadata_query(query: str | None) -> dict[str, str]:
    """The list filter: the SDK sends urlencode({quote(k): quote(v)}) as one parameter."""
    if not query:
        return {}
    return {
        urllib.parse.unquote(k): urllib.parse.unquote(v)
        for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)
    }


def end_at(now: datetime, timeout_seconds: int) -> str:
    return (now + timedelta(seconds=timeout_seconds)).isoformat()


def _annotations(session: Resource) -> Mapping[str, str]:
    return (session.get("metadata") or {}).get("annotations") or {}


def sandbox_annotations(
    template: str, metadata: Mapping[str, str], envs: Mapping[str, str], started: datetime, end: str
) -> dict[str, str]:
    return {
        TEMPLATE_ANNOTATION: template,
        METADATA_ANNOTATION: json.dumps(dict(metadata), sort_keys=True),
        ENVS_ANNOTATION: json.dumps(dict(envs), sort_keys=True),
        STARTED_ANNOTATION: started.isoformat(),
        END_ANNOTATION: end,
    }


def _json_annotation(session: Resource, name: str) -> dict[str, str]:
    try:
        found = json.loads(_annotations(session).get(name) or "{}")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def sandbox_metadata(session: Resource) -> dict[str, str]:
    return _json_annotation(session, METADATA_ANNOTATION)


def sandbox_envs(session: Resource) -> dict[str, str]:
    """The environment variables the sandbox was created with (Sandbox.create(envs=))."""
    return _json_annotation(session, ENVS_ANNOTATION)


def sandbox_template(session: Resource) -> str:
    return _annotations(session).get(TEMPLATE_ANNOTATION, "base")


def check_end(end: str, created: str | None, max_lifetime_seconds: int) -> None:
    """A new end within the session's lifetime (the tenant's maximum from its creation)."""
    if created is None:
        return
    started = datetime.fromisoformat(created.replace("Z", "+00:00"))
    latest = started + timedelta(seconds=max_lifetime_seconds)
    if datetime.fromisoformat(end) > latest:
        raise E2bError(
            400,
            f"timeout: a sandbox lives at most {max_lifetime_seconds} s from its creation "
            f"(the tenant's limit); it can run until {latest.isoformat()}",
        )


def sandbox_started(session: Resource) -> datetime | None:
    """E2B's startedAt: the annotation's microseconds, else creationTimestamp's seconds."""
    return parse_time(_annotations(session).get(STARTED_ANNOTATION)) or created_at(session)


def sandbox_end(session: Resource) -> datetime | None:
    return parse_time(_annotations(session).get(END_ANNOTATION))


def is_expired(session: Resource, now: datetime) -> bool:
    end = sandbox_end(session)
    return end is not None and end <= now


def is_running(session: Resource, now: datetime) -> bool:
    """Neither ended, nor being deleted (killed: the operator is ending it), nor past its end."""
    if (session.get("metadata") or {}).get("deletionTimestamp"):
        return False
    ended = session_info(session).status == SessionStatus.ended
    return not ended and not is_expired(session, now)


@dataclass(frozen=True)
class SandboxFilter:
    """What a list keeps, by E2B's query: metadata, template, startedAfter (inclusive)."""

    metadata: Mapping[str, str]
    template: str | None = None
    started_after: datetime | None = None

    def admits(self, session: Resource) -> bool:
        metadata = sandbox_metadata(session)
        if any(metadata.get(k) != v for k, v in self.metadata.items()):
            return False
        if self.template is not None and sandbox_template(session) != self.template:
            return False
        return self.started_after is None or _started_since(session, self.started_after)


def _started_since(session: Resource, moment: datetime) -> bool:
    started = sandbox_started(session)
    # A time without its zone is UTC's, as the API server's own.
    since = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return started is not None and started >= since


def _quantity_mb(value: str | None, default: int) -> int:
    if not value:
        return default
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "K": 1 / 1000 / 1.048576, "M": 1 / 1.048576}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return max(1, int(float(value[: -len(suffix)]) * factor))
    return max(1, int(value) // (1024 * 1024)) if value.isdigit() else default


def _cpu_count(value: str | None) -> int:
    if not value:
        return 1
    cores = float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    return max(1, round(cores))


def created_sandbox(sandbox_id: str, template: str, token: str) -> dict[str, Any]:
    """E2B's Sandbox (the answer to create and connect)."""
    return {
        "templateID": template,
        "sandboxID": sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": token,
        "domain": None,
    }


def listed_sandbox(session: Resource, now: datetime) -> dict[str, Any]:
    """E2B's ListedSandbox (SandboxDetail adds its tokens)."""
    info = session_info(session)
    started = sandbox_started(session) or now
    return {
        "templateID": sandbox_template(session),
        "sandboxID": info.id,
        "clientID": CLIENT_ID,
        "startedAt": started.isoformat(),
        "endAt": (
            sandbox_end(session) or started + timedelta(seconds=info.max_lifetime_seconds)
        ).isoformat(),
        "cpuCount": _cpu_count(info.cpu),
        "memoryMB": _quantity_mb(info.memory, 256),
        "diskSizeMB": 256,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": sandbox_metadata(session),
    }


def page_of(
    sessions: Iterable[Resource], limit: int, next_token: str | None, order: str
) -> tuple[list[Resource], str | None]:
    """A page of sandboxes by start time then name; the token is the last one's name."""

    def key(session: Resource) -> tuple[datetime, str]:
        name = str((session.get("metadata") or {}).get("name") or "")
        return (sandbox_started(session) or datetime.min.replace(tzinfo=UTC), name)

    ordered = sorted(sessions, key=key, reverse=order == "desc")
    if next_token:
        names = [key(s)[1] for s in ordered]
        if next_token not in names:
            raise E2bError(400, "nextToken is unknown or expired")
        ordered = ordered[names.index(next_token) + 1 :]
    page = ordered[:limit]
    more = len(ordered) > limit
    return page, (key(page[-1])[1] if more and page else None)


# What an upload's Content-Encoding may be (envd decodes gzip; the SDK sends nothing else).
IDENTITY_ENCODINGS = frozenset({"", "identity"})
GZIP_ENCODINGS = frozenset({"gzip", "x-gzip"})


def is_identity(encoding: str | None) -> bool:
    return (encoding or "").strip().lower() in IDENTITY_ENCODINGS


def decoded_upload(data: bytes, encoding: str | None, limit: int) -> bytes:
    """An upload's bytes as the file holds them: a gzip body decompressed, never past `limit`
    bytes (413 beyond: a small body cannot expand without bound); 400 for a malformed gzip
    body, 415 for another encoding."""
    if is_identity(encoding):
        return data
    if (encoding or "").strip().lower() not in GZIP_ENCODINGS:
        raise E2bError(415, f"Content-Encoding {encoding!r}: uploads may be gzip or identity")
    return _gunzipped(data, limit)


def _gunzipped(data: bytes, limit: int) -> bytes:
    out = bytearray()
    rest = data
    # Concatenated gzip members make one file, as gzip -d reads them.
    while True:
        stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out += stream.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise E2bError(400, f"the gzip body is malformed: {exc}") from None
        if len(out) > limit:
            raise E2bError(
                413, f"the file is over {limit} bytes decompressed (the tenant's maxFileBytes)"
            )
        if not stream.eof:
            raise E2bError(400, "the gzip body ends before its stream does")
        rest = stream.unused_data
        if not rest:
            return bytes(out)


def _now_ns() -> int:
    return time.time_ns()


def _line(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields}) + "\n"


def _chunks(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def failure_error(result: ExecutionResult) -> dict[str, str] | None:
    """A run the platform ended (timeout, memory, a lost kernel): its words as an error."""
    if result.status in (ExecutionStatus.success, ExecutionStatus.error) and not result.state_lost:
        return None
    message = result.error_message or result.reason or result.status.value
    return {"name": result.reason or "SandpodError", "value": message, "traceback": message}


# The session module's answer is the run's value, which the runner keeps up to 64 KiB.
MAX_ANSWER_BYTES = 64 * 1024
MAX_DISPLAYS = 128
ANSWER_ERRORS = {"not_found": 404, "invalid_argument": 400}


class CellResult(BaseModel):
    """One result of a cell, as E2B's Result carries it."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json_: dict[str, Any] | list[Any] | None = Field(default=None, alias="json")
    javascript: str | None = None
    data: dict[str, Any] | None = None
    is_main_result: bool = False


class CellError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    value: str
    traceback: str


class CellAnswer(BaseModel):
    """What the session module answers for a cell."""

    model_config = ConfigDict(extra="forbid")

    results: list[CellResult] = Field(max_length=MAX_DISPLAYS + 1)
    error: CellError | None
    count: int = Field(ge=1)
    # The charts of the figures the cell saved, by their file's name (E2B's Result.chart).
    charts: dict[str, dict[str, Any]] = Field(default_factory=dict)


class MalformedAnswer(Exception):
    """The session answered something else than the module's JSON (its words, shortened)."""


def session_answer(value: str | None) -> dict[str, Any]:
    """The module's JSON answer (an object) from a run's value; an error it names is an
    E2bError (404, 400), anything else malformed."""
    if value is None:
        raise MalformedAnswer("the sandbox's session gave no answer")
    if len(value.encode()) > MAX_ANSWER_BYTES:
        raise MalformedAnswer(f"the sandbox's answer is over {MAX_ANSWER_BYTES} bytes")
    try:
        answer = json.loads(value)
    except (ValueError, RecursionError):
        raise MalformedAnswer(f"the sandbox's answer is not JSON: {value[:200]!r}") from None
    if not isinstance(answer, dict):
        raise MalformedAnswer(f"the sandbox's answer is not a JSON object: {value[:200]!r}")
    error = answer.get("error")
    if isinstance(error, list) and len(error) == 2 and all(isinstance(e, str) for e in error):
        status = ANSWER_ERRORS.get(error[0])
        if status is None:
            raise MalformedAnswer(f"the sandbox's module failed: {error[1][:500]}")
        raise E2bError(status, error[1])
    return answer


def cell_answer(value: str | None) -> CellAnswer:
    answer = session_answer(value)
    try:
        return CellAnswer.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = f"the sandbox's answer is malformed at {where}: {first['msg']}"
        raise MalformedAnswer(message) from None


def _logs(stdout: str, stderr: str) -> list[str]:
    stamp = _now_ns()
    lines = [_line("stdout", text=chunk, timestamp=stamp) for chunk in _chunks(stdout)]
    return lines + [_line("stderr", text=chunk, timestamp=stamp) for chunk in _chunks(stderr)]


def _pngs(result: ExecutionResult, charts: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """A result for each figure the run saved, with its chart when the cell read one."""
    lines = []
    for file in result.files:
        if file.media_type == "image/png" and file.content_base64:
            chart = (charts or {}).get(PurePosixPath(file.path).name)
            extra = {} if chart is None else {"chart": chart}
            lines.append(_line("result", png=file.content_base64, is_main_result=False, **extra))
    return lines


def _end(error: dict[str, str] | None, execution_count: int | None) -> list[str]:
    lines = [] if error is None else [_line("error", **error)]
    if execution_count is not None:
        lines.append(_line("number_of_executions", execution_count=execution_count))
    return [*lines, _line("end_of_execution")]


def plain_text(text: str) -> str:
    """A result's text as E2B's code interpreter gives it: the repr, less one pair of
    enclosing single quotes (so a str's value shows as itself, `bar` for 'bar')."""
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "'" else text


def _result_line(result: CellResult) -> str:
    fields = result.model_dump(by_alias=True, exclude_none=True)
    if "text" in fields:
        fields["text"] = plain_text(fields["text"])
    return _line("result", **fields)


def execute_lines(result: ExecutionResult, *, logs_streamed: bool = False) -> list[str]:
    """The code interpreter's /execute answer (JSON lines) for a cell's run: its logs (unless
    they were streamed live), its figures, then the module's results, error and count. A run
    the platform ended, or an answer the module cannot have given, is an error (SandpodError
    for the latter)."""
    logs = [] if logs_streamed else _logs(result.stdout, result.stderr)
    failure = failure_error(result)
    if failure is not None:
        return [*logs, *_pngs(result), *_end(failure, None)]
    try:
        answer = cell_answer(result.result)
    except (MalformedAnswer, E2bError) as exc:
        message = exc.message if isinstance(exc, E2bError) else str(exc)
        return [*logs, *failed_lines(message)]
    results = [_result_line(r) for r in answer.results]
    error = None if answer.error is None else answer.error.model_dump()
    return [*logs, *_pngs(result, answer.charts), *results, *_end(error, answer.count)]


def log_line(stream: str, text: str) -> str:
    """One chunk of a cell's output, live."""
    return _line(stream, text=text, timestamp=_now_ns())


def failed_lines(message: str) -> list[str]:
    """The end of an answer whose cell sandpod could not see through (SandpodError)."""
    return _end({"name": "SandpodError", "value": message, "traceback": message}, None)


def cell_code(code: str, language: str | None) -> str:
    """A cell as IPython runs it: Python's common leading indent removed. Only a cell that has
    one is dedented, as dedent also empties whitespace-only lines (in a string literal too)."""
    if language not in (None, "python"):
        return code
    first = next((line for line in code.splitlines() if line.strip()), "")
    return textwrap.dedent(code) if first[:1] in (" ", "\t") else code


def new_context_id() -> str:
    return str(uuid.uuid4())


def now() -> datetime:
    return datetime.now(UTC)
