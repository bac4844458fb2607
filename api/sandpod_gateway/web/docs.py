"""The API docs at /docs (Swagger UI) and /redoc (ReDoc), served by the gateway itself: their
scripts and styles come from the fastapi-offline package, so the pages work without internet
and run no third party's script on the gateway's origin. No inline script either: Swagger UI
starts from a script of its own, so the pages' policy can be `script-src 'self'`."""

import json
from html import escape

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

SWAGGER_UI_PATH = "/docs"
REDOC_PATH = "/redoc"
DOCS_PATHS = (SWAGGER_UI_PATH, REDOC_PATH)
ASSETS_PATH = f"{SWAGGER_UI_PATH}/assets"
SWAGGER_UI_INIT_PATH = f"{SWAGGER_UI_PATH}/swagger-ui-init.js"
# Swagger UI bundle, its CSS, ReDoc's standalone bundle and a favicon.
ASSETS_PACKAGE = ("fastapi_offline", "static")


def swagger_ui_page(title: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} - Swagger UI</title>
<link rel="icon" href="{ASSETS_PATH}/favicon.png">
<link rel="stylesheet" href="{ASSETS_PATH}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{ASSETS_PATH}/swagger-ui-bundle.js"></script>
<script src="{SWAGGER_UI_INIT_PATH}"></script>
</body>
</html>
"""


def swagger_ui_init(openapi_url: str) -> str:
    # No validatorUrl: Swagger UI would otherwise send the spec to validator.swagger.io.
    config = {
        "url": openapi_url,
        "dom_id": "#swagger-ui",
        "layout": "BaseLayout",
        "deepLinking": True,
        "showExtensions": True,
        "showCommonExtensions": True,
        "validatorUrl": None,
    }
    return (
        f"const config = {json.dumps(config)};\n"
        "config.presets = [\n"
        "  SwaggerUIBundle.presets.apis,\n"
        "  SwaggerUIBundle.SwaggerUIStandalonePreset,\n"
        "];\n"
        "window.ui = SwaggerUIBundle(config);\n"
    )


def redoc_page(title: str, openapi_url: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} - ReDoc</title>
<link rel="icon" href="{ASSETS_PATH}/favicon.png">
</head>
<body>
<redoc spec-url="{escape(openapi_url)}"></redoc>
<script src="{ASSETS_PATH}/redoc.standalone.js"></script>
</body>
</html>
"""


def install_docs(app: FastAPI) -> None:
    """/docs and /redoc for an app made with docs_url=None and redoc_url=None."""
    openapi_url = app.openapi_url
    if openapi_url is None:
        raise ValueError("the API docs show the app's OpenAPI document: give it an openapi_url")
    swagger_ui = swagger_ui_page(app.title)
    init = swagger_ui_init(openapi_url)
    redoc = redoc_page(app.title, openapi_url)

    app.mount(ASSETS_PATH, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")

    @app.get(SWAGGER_UI_PATH, include_in_schema=False)
    async def swagger_ui_html() -> HTMLResponse:
        return HTMLResponse(swagger_ui)

    @app.get(SWAGGER_UI_INIT_PATH, include_in_schema=False)
    async def swagger_ui_init_js() -> Response:
        return Response(init, media_type="text/javascript")

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc_html() -> HTMLResponse:
        return HTMLResponse(redoc)
