"""The gateway app: ``uvicorn sandpod_gateway.main:create_app --factory``."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path

from fastapi import FastAPI
from sandpod_contract.kube import open_api_client

from sandpod_gateway.families.e2b import router as e2b
from sandpod_gateway.families.judge0 import router as judge0
from sandpod_gateway.families.judge0.callbacks import Judge0Callbacks
from sandpod_gateway.families.mcp import router as mcp
from sandpod_gateway.families.mcp.mcp_server import build_mcp_server, new_session_manager
from sandpod_gateway.families.sandpod import (
    executions_router,
    health_router,
    languages_router,
    sessions_router,
    tenant_router,
)
from sandpod_gateway.families.tools import router as tools
from sandpod_gateway.kube.kube_service import KubernetesExecutionService, KubernetesSessionService
from sandpod_gateway.kube.operator_endpoint import OperatorEndpoint
from sandpod_gateway.languages import load_language_catalog
from sandpod_gateway.policy.admission import AdmissionControl
from sandpod_gateway.policy.auth import SecretApiKeyStore
from sandpod_gateway.policy.tenant_counts import OperatorCounts
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.direct_runs import DirectRunner
from sandpod_gateway.usecases.sessions import KnownSessions
from sandpod_gateway.web.body_limit import BodySizeLimitMiddleware
from sandpod_gateway.web.docs import install_docs
from sandpod_gateway.web.errors import install_error_handlers
from sandpod_gateway.web.metrics import GatewayMetrics, MetricsMiddleware
from sandpod_gateway.web.pad import PAD_DIR, install_pad
from sandpod_gateway.web.security_headers import SecurityHeadersMiddleware

DESCRIPTION = """\
Run untrusted code in short-lived gVisor sandboxes on Kubernetes.

Authenticate with `Authorization: Bearer <api key>`. Errors are JSON:
`{"error": {"code": "...", "message": "...", "details": [...]}}`.
Sessions (`/v1/sessions`) keep one sandbox between runs: files, packages and, in Python,
JavaScript and TypeScript, the interpreter's variables persist.
MCP clients: streamable HTTP at `/mcp` (tools `run_code`, `open_session`, `run_in_session`,
`close_session`), same API key.
"""


def create_app(settings: GatewaySettings | None = None, pad_dir: Path = PAD_DIR) -> FastAPI:
    """The app; `pad_dir` holds the built scratch pad (hack/web/build.sh, or the image's)."""
    settings = settings or GatewaySettings()
    catalog = load_language_catalog(settings.catalog_path)
    metrics = GatewayMetrics()
    mcp_server = build_mcp_server(catalog)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        api_client = await open_api_client(settings.kubeconfig)
        try:
            app.state.key_store = SecretApiKeyStore(
                api_client,
                namespace=settings.api_keys_namespace,
                secret_name=settings.api_keys_secret,
                refresh_seconds=settings.api_keys_refresh_seconds,
            )
            app.state.execution_service = KubernetesExecutionService(
                api_client, log_follow_limit_bytes=settings.max_log_follow_bytes
            )
            app.state.session_service = KubernetesSessionService(api_client)
            app.state.direct_runner = DirectRunner.of(settings, api_client)
            endpoint = OperatorEndpoint.of(settings, api_client)
            app.state.tenant_counts = (
                None
                if endpoint is None
                else OperatorCounts(endpoint, settings.default_retry_after_seconds)
            )
            app.state.mcp_sessions = new_session_manager(mcp_server, settings)
            async with app.state.mcp_sessions.run():
                yield
        finally:
            await app.state.judge0_callbacks.close()
            if app.state.direct_runner is not None:
                await app.state.direct_runner.close()
            if app.state.tenant_counts is not None:
                await app.state.tenant_counts.close()
            await api_client.close()

    app = FastAPI(
        title="sandpod gateway",
        version=version("sandpod"),
        description=DESCRIPTION,
        lifespan=lifespan,
        # Served by install_docs, from the gateway's own copies of their scripts.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.catalog = catalog
    app.state.metrics = metrics
    app.state.admission = AdmissionControl()
    app.state.known_sessions = KnownSessions()
    app.state.direct_runner = None
    app.state.tenant_counts = None
    app.state.judge0_callbacks = Judge0Callbacks()
    app.state.e2b_token_key = e2b.token_key(settings)
    app.state.e2b_module_installed = e2b.ModuleInstalled()
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    # Outermost: every answer carries the headers, the 413s of the body limit included.
    app.add_middleware(SecurityHeadersMiddleware)
    for module in (
        executions_router,
        sessions_router,
        languages_router,
        tenant_router,
        tools,
        health_router,
        mcp,
        judge0,
    ):
        app.include_router(module.router)
    app.include_router(e2b.api)
    app.include_router(e2b.data_plane)
    app.include_router(e2b.unserved)
    install_pad(app, pad_dir)
    install_docs(app)
    return app
