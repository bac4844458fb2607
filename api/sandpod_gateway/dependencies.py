"""FastAPI dependencies, as Annotated aliases. Unit tests replace them through
app.dependency_overrides (get_key_store, get_execution_service, get_session_service)."""

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandpod_gateway.admission import AdmissionControl
from sandpod_gateway.auth import ApiKeyStore, KeyStoreUnavailable, Tenant
from sandpod_gateway.errors import GatewayError
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.metrics import GatewayMetrics
from sandpod_gateway.service import ExecutionService, SessionService
from sandpod_gateway.sessions import SessionContext
from sandpod_gateway.settings import GatewaySettings


def get_settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


def get_catalog(request: Request) -> LanguageCatalog:
    catalog: LanguageCatalog = request.app.state.catalog
    return catalog


def get_metrics(request: Request) -> GatewayMetrics:
    metrics: GatewayMetrics = request.app.state.metrics
    return metrics


def get_admission(request: Request) -> AdmissionControl:
    admission: AdmissionControl = request.app.state.admission
    return admission


def get_key_store(request: Request) -> ApiKeyStore:
    key_store: ApiKeyStore = request.app.state.key_store
    return key_store


def get_execution_service(request: Request) -> ExecutionService:
    service: ExecutionService = request.app.state.execution_service
    return service


def get_session_service(request: Request) -> SessionService:
    service: SessionService = request.app.state.session_service
    return service


SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
CatalogDep = Annotated[LanguageCatalog, Depends(get_catalog)]
MetricsDep = Annotated[GatewayMetrics, Depends(get_metrics)]
AdmissionDep = Annotated[AdmissionControl, Depends(get_admission)]
KeyStoreDep = Annotated[ApiKeyStore, Depends(get_key_store)]
ExecutionServiceDep = Annotated[ExecutionService, Depends(get_execution_service)]
SessionServiceDep = Annotated[SessionService, Depends(get_session_service)]

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key: `Authorization: Bearer <key>`. Each key belongs to one tenant.",
)


async def get_current_tenant(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    key_store: KeyStoreDep,
    settings: SettingsDep,
) -> Tenant:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise GatewayError(
            401,
            "unauthorized",
            "Missing API key: send Authorization: Bearer <key>",
            headers=challenge,
        )
    try:
        tenant = await key_store.authenticate(credentials.credentials)
    except KeyStoreUnavailable as exc:
        raise GatewayError(
            503,
            "auth_unavailable",
            "API keys cannot be checked right now; retry later.",
            headers={"Retry-After": str(settings.default_retry_after_seconds)},
        ) from exc
    if tenant is None:
        raise GatewayError(401, "unauthorized", "Invalid API key", headers=challenge)
    return tenant


CurrentTenant = Annotated[Tenant, Depends(get_current_tenant)]


def get_session_context(
    tenant: CurrentTenant,
    sessions: SessionServiceDep,
    executions: ExecutionServiceDep,
    catalog: CatalogDep,
    settings: SettingsDep,
    admission: AdmissionDep,
) -> SessionContext:
    return SessionContext(tenant, sessions, executions, catalog, settings, admission)


SessionContextDep = Annotated[SessionContext, Depends(get_session_context)]
