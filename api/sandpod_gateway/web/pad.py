"""The scratch pad: the page built from web/ (hack/web/build.sh), served as static files (its
headers: security_headers.PAD_HEADERS)."""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from sandpod_gateway.web.errors import GatewayError

PAD_PATH = "/pad"
# Where hack/web/build.sh (and the gateway image's build) put the bundled page:
# api/sandpod_gateway/pad/, at the package's top.
PAD_DIR = Path(__file__).parents[1] / "pad"


def install_pad(app: FastAPI, directory: Path) -> None:
    """The page at /pad/ (and / leads there); when it was not built, /pad/ says so."""
    if (directory / "index.html").is_file():
        app.mount(PAD_PATH, StaticFiles(directory=directory, html=True), name="pad")
    else:

        @app.get(PAD_PATH + "/{asset:path}", include_in_schema=False)
        async def pad_not_built(asset: str) -> None:
            raise GatewayError(
                404, "pad_not_built", "The scratch pad was not built (hack/web/build.sh)"
            )

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(PAD_PATH + "/")
