"""The scratch pad: the page built from web/ (hack/web/build.sh), served as static files."""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from sandpod_gateway.errors import GatewayError

PAD_PATH = "/pad"
# Where hack/web/build.sh (and the gateway image's build) put the bundled page.
PAD_DIR = Path(__file__).with_name("pad")

# The page shows what sandboxed programs print and make, next to the API key: only its own
# scripts run, it talks only to its own origin, and no other site may frame it.
PAD_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class PadFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAD_HEADERS)
        return response


def install_pad(app: FastAPI, directory: Path) -> None:
    """The page at /pad/ (and / leads there); when it was not built, /pad/ says so."""
    if (directory / "index.html").is_file():
        app.mount(PAD_PATH, PadFiles(directory=directory, html=True), name="pad")
    else:

        @app.get(PAD_PATH + "/{asset:path}", include_in_schema=False)
        async def pad_not_built(asset: str) -> None:
            raise GatewayError(
                404, "pad_not_built", "The scratch pad was not built (hack/web/build.sh)"
            )

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(PAD_PATH + "/")
