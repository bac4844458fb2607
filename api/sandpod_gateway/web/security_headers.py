"""The security headers of every answer the gateway sends, decided here.

Every answer: `nosniff`, no referrer, and a Content-Security-Policy with `frame-ancestors
'none'` (no other site may frame the origin where the scratch pad keeps its API key). Its
policy depends on what the answer is: the API's JSON and streams run nothing; the pad and the
API docs run only the gateway's own scripts and talk only to it; a file a program made is an
attachment, sandboxed, never rendered on this origin.
"""

from urllib.parse import quote

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from sandpod_gateway.web.docs import DOCS_PATHS
from sandpod_gateway.web.http_middleware import HttpMiddleware
from sandpod_gateway.web.pad import PAD_PATH

API_POLICY = "default-src 'none'; frame-ancestors 'none'"
# The scratch pad shows what sandboxed programs print and make, next to the API key.
PAD_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
# Swagger UI and ReDoc, from the gateway's own copies: inline styles (both set them from
# script), data: images (Swagger UI's icons), a blob: worker (ReDoc's search).
DOCS_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; worker-src blob:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
ATTACHMENT_POLICY = "sandbox; default-src 'none'; frame-ancestors 'none'"

COMMON_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
API_HEADERS = {**COMMON_HEADERS, "Content-Security-Policy": API_POLICY}
PAD_HEADERS = {**COMMON_HEADERS, "Content-Security-Policy": PAD_POLICY, "Cache-Control": "no-cache"}
DOCS_HEADERS = {**COMMON_HEADERS, "Content-Security-Policy": DOCS_POLICY}
ATTACHMENT_HEADERS = {**COMMON_HEADERS, "Content-Security-Policy": ATTACHMENT_POLICY}


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def headers_for(path: str) -> dict[str, str]:
    """The headers an answer to a request for this path carries (unless it set them itself)."""
    if _under(path, PAD_PATH):
        return PAD_HEADERS
    if any(_under(path, docs_path) for docs_path in DOCS_PATHS):
        return DOCS_HEADERS
    return API_HEADERS


def attachment_response(content: bytes, media_type: str, path: str) -> Response:
    """Bytes a program chose, as a download named after the last part of `path`: never
    rendered, sniffed or run on this origin."""
    filename = path.rsplit("/", 1)[-1]
    return Response(
        content,
        media_type=media_type,
        headers={
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}",
            **ATTACHMENT_HEADERS,
        },
    )


class SecurityHeadersMiddleware(HttpMiddleware):
    """Adds the headers of `headers_for` to every HTTP answer, keeping those a response set
    itself (an attachment's)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = headers_for(scope["path"])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in wanted.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
