"""Refuse request bodies over a size limit with a JSON 413, before anything parses them."""

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandpod_gateway.web.errors import ErrorDetail, GatewayError, error_response
from sandpod_gateway.web.http_middleware import HttpMiddleware


class RequestBodyTooLarge(HTTPException):
    """Raised from receive() once the body passes the limit. An HTTPException, so FastAPI
    passes it through body parsing to the exception handlers (JSON 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The request body exceeds {limit} bytes")
        self.limit = limit


def too_large_response(limit: int) -> ASGIApp:
    return error_response(
        GatewayError(
            413,
            "payload_too_large",
            f"The request body exceeds {limit} bytes",
            [ErrorDetail(message="request body too large", type="max_request_bytes", limit=limit)],
        )
    )


class BodySizeLimitMiddleware(HttpMiddleware):
    """413 for a body that declares more than `max_bytes`, or sends more while it is read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await too_large_response(self.max_bytes)(scope, receive, send)
            return

        received = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestBodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except RequestBodyTooLarge:
            if response_started:
                raise
            await too_large_response(self.max_bytes)(scope, receive, send)
