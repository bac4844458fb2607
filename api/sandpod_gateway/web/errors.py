"""JSON errors: every error answer is {"error": {"code", "message", "details"}}."""

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandpod_gateway.kube.service import (
    ExecutionNotFound,
    KubernetesUnavailable,
    QuotaExceeded,
    QuotaNotCounted,
    SessionNotFound,
)

logger = logging.getLogger(__name__)

# Stable codes for errors Starlette/FastAPI raise themselves.
HTTP_STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


class ErrorDetail(BaseModel):
    field: str | None = Field(default=None, description="Where the problem is, e.g. body.code")
    message: str
    type: str | None = Field(default=None, description="Machine-readable kind of problem")
    limit: int | str | None = Field(default=None, description="The limit that was exceeded")


class ErrorBody(BaseModel):
    code: str = Field(description="Stable, machine-readable error code")
    message: str = Field(description="Human-readable explanation")
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: ErrorBody


class GatewayError(Exception):
    """An error answer: status, stable code, human message, optional details and headers;
    `retry_after`: seconds a client should wait before trying again (a 429's or 503's)."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        details: Sequence[ErrorDetail] = (),
        headers: Mapping[str, str] | None = None,
        retry_after: int | str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = list(details)
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)


def error_response(error: GatewayError) -> JSONResponse:
    body = ErrorResponse(
        error=ErrorBody(code=error.code, message=error.message, details=error.details)
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=error.status_code,
        headers=error.headers or None,
    )


def format_location(location: Sequence[int | str]) -> str:
    """("body", "files", 0, "path") -> "body.files[0].path"."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def validation_details(errors: Sequence[Any]) -> list[ErrorDetail]:
    """Field-level details of pydantic errors, without echoing the (possibly huge) input."""
    return [
        ErrorDetail(
            field=format_location(error.get("loc", ())),
            message=str(error.get("msg", "invalid value")),
            type=str(error.get("type", "value_error")),
        )
        for error in errors
    ]


def not_found(execution_id: str) -> GatewayError:
    return GatewayError(404, "not_found", f"No execution {execution_id!r}")


def unavailable(exc: KubernetesUnavailable, retry_after_seconds: int) -> GatewayError:
    logger.warning("Kubernetes unavailable: %s", exc)
    return GatewayError(
        503,
        "kubernetes_unavailable",
        "The cluster could not be reached; retry later.",
        retry_after=retry_after_seconds,
    )


# The quota controller counts a new ResourceQuota within about a second (one synced before the
# controller found a new CRD waits for its full resync, 5 minutes by default).
QUOTA_NOT_COUNTED_RETRY_AFTER_SECONDS = 1


def quota_exceeded(exc: QuotaExceeded, retry_after_seconds: int) -> GatewayError:
    return GatewayError(
        429,
        "quota_exceeded",
        f"The tenant's namespace is at its ResourceQuota {exc.quota} ({exc.limited}); "
        "delete finished executions or close sessions, or retry once they have expired.",
        [
            ErrorDetail(
                message=f"ResourceQuota {exc.quota}", type="resource_quota", limit=exc.limited
            )
        ],
        retry_after=retry_after_seconds,
    )


def quota_not_counted(exc: QuotaNotCounted) -> GatewayError:
    return GatewayError(
        503,
        "quota_not_counted",
        f"The tenant namespace's ResourceQuota {exc.quota} is not counted yet by the cluster's "
        "quota controller (a new quota, or a new CRD); retry shortly.",
        [ErrorDetail(message=f"ResourceQuota {exc.quota}", type="resource_quota")],
        retry_after=QUOTA_NOT_COUNTED_RETRY_AFTER_SECONDS,
    )


def as_gateway_error(exc: Exception, retry_after_seconds: int) -> GatewayError | None:
    """The error answer for what the use cases raise (HTTP handlers and the MCP tool)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, KubernetesUnavailable):
        return unavailable(exc, retry_after_seconds)
    if isinstance(exc, ExecutionNotFound):
        return not_found(str(exc))
    if isinstance(exc, SessionNotFound):
        return GatewayError(404, "not_found", f"No session {str(exc)!r}")
    if isinstance(exc, QuotaExceeded):
        return quota_exceeded(exc, retry_after_seconds)
    if isinstance(exc, QuotaNotCounted):
        return quota_not_counted(exc)
    return None


async def handle_gateway_error(request: Request, exc: Exception) -> JSONResponse:
    error = as_gateway_error(exc, request.app.state.settings.default_retry_after_seconds)
    assert error is not None
    return error_response(error)


async def handle_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(
        GatewayError(
            422,
            "invalid_request",
            "The request is not valid; see details.",
            validation_details(exc.errors()),
        )
    )


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    code = HTTP_STATUS_CODES.get(status, "error")
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).phrase
    return error_response(GatewayError(status, code, message, headers=exc.headers))


async def handle_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        GatewayError(500, "internal_error", "Internal error; the request may be retried.")
    )


def install_error_handlers(app: FastAPI) -> None:
    handled = (
        GatewayError,
        KubernetesUnavailable,
        ExecutionNotFound,
        SessionNotFound,
        QuotaExceeded,
        QuotaNotCounted,
    )
    for error in handled:
        app.add_exception_handler(error, handle_gateway_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_exception)
    app.add_exception_handler(Exception, handle_unexpected_error)


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Bad request: unknown language (the message lists the known ones), "
    "lint not available, invalid cursor, file transfer not available for the language",
    401: "Missing or invalid API key",
    404: "No such execution, session or file for this tenant",
    409: "Conflict (Idempotency-Key reused for a different request; the session has ended; "
    "a file transfer failed)",
    413: "Request body, code or file too large",
    415: "An upload that is not UTF-8 text",
    422: "Invalid input, or over a tenant limit (details name the field and the limit)",
    429: "Too many requests per second (rate_limited), executions running (concurrency_limit), "
    "sessions open (session_limit), requests waiting or streaming (too_many_waits) for this "
    "tenant, or its namespace's ResourceQuota used up (quota_exceeded); see Retry-After",
    503: "The cluster or the API keys are unavailable, or the namespace's ResourceQuota is not "
    "counted yet (quota_not_counted); see Retry-After",
}


def error_responses(*status_codes: int, streaming: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error answers.

    FastAPI documents a `model` in the route's own media type; a streaming route's
    errors are still JSON, so those refer to the ErrorResponse schema by hand.
    """
    if streaming:
        schema = {"$ref": "#/components/schemas/ErrorResponse"}
        return {
            code: {
                "description": ERROR_DESCRIPTIONS[code],
                "content": {"application/json": {"schema": schema}},
            }
            for code in status_codes
        }
    return {
        code: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[code]}
        for code in status_codes
    }


def responses_with(
    status_code: int, model: type[BaseModel], description: str, *error_codes: int
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses`: a second success answer (e.g. 202 beside the route's 200) and the
    error answers."""
    return {
        status_code: {"model": model, "description": description},
        **error_responses(*error_codes),
    }
