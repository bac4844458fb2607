"""FastAPI dependencies, as Annotated aliases. Unit tests replace them through
app.dependency_overrides (get_key_store, get_execution_service, get_session_service,
get_direct_runner)."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandpod_gateway.kube.service import ExecutionService, SessionService
from sandpod_gateway.languages import LanguageCatalog
from sandpod_gateway.policy.admission import AdmissionControl
from sandpod_gateway.policy.auth import ApiKeyStore, KeyStoreUnavailable, Tenant
from sandpod_gateway.policy.tenant_counts import OperatorCounts
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.direct_runs import DirectRunner
from sandpod_gateway.usecases.executions import ExecutionContext
from sandpod_gateway.usecases.sessions import KnownSessions, SessionContext
from sandpod_gateway.web.errors import GatewayError
from sandpod_gateway.web.metrics import GatewayMetrics

T = TypeVar("T")
# A dependency that returns one of the app's state attributes.
StateDependency = Callable[[Request], Awaitable[T]]


def from_app_state(attribute: str) -> StateDependency[Any]:
    """A dependency returning what create_app stored as app.state.<attribute> (async, as
    every dependency here: FastAPI runs a plain function's in a worker thread, a hop each)."""

    async def dependency(request: Request) -> Any:
        return getattr(request.app.state, attribute)

    dependency.__name__ = f"get_{attribute}"
    return dependency


get_settings: StateDependency[GatewaySettings] = from_app_state("settings")
get_catalog: StateDependency[LanguageCatalog] = from_app_state("catalog")
get_metrics: StateDependency[GatewayMetrics] = from_app_state("metrics")
get_admission: StateDependency[AdmissionControl] = from_app_state("admission")
get_key_store: StateDependency[ApiKeyStore] = from_app_state("key_store")
get_execution_service: StateDependency[ExecutionService] = from_app_state("execution_service")
get_session_service: StateDependency[SessionService] = from_app_state("session_service")
get_direct_runner: StateDependency[DirectRunner | None] = from_app_state("direct_runner")
get_tenant_counts: StateDependency[OperatorCounts | None] = from_app_state("tenant_counts")
get_known_sessions: StateDependency[KnownSessions] = from_app_state("known_sessions")


SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
CatalogDep = Annotated[LanguageCatalog, Depends(get_catalog)]
MetricsDep = Annotated[GatewayMetrics, Depends(get_metrics)]
AdmissionDep = Annotated[AdmissionControl, Depends(get_admission)]
KeyStoreDep = Annotated[ApiKeyStore, Depends(get_key_store)]
ExecutionServiceDep = Annotated[ExecutionService, Depends(get_execution_service)]
SessionServiceDep = Annotated[SessionService, Depends(get_session_service)]
DirectRunnerDep = Annotated[DirectRunner | None, Depends(get_direct_runner)]
TenantCountsDep = Annotated[OperatorCounts | None, Depends(get_tenant_counts)]
KnownSessionsDep = Annotated[KnownSessions, Depends(get_known_sessions)]

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key: `Authorization: Bearer <key>`. Each key belongs to one tenant.",
)


async def authenticate(
    key: str | None,
    key_store: ApiKeyStore,
    settings: GatewaySettings,
    admission: AdmissionControl,
    how: str = "Authorization: Bearer <key>",
) -> Tenant:
    """The tenant of API key `key` (401 without a known key; `how` tells how to send one), and
    the request counted against the tenant's rate (429 rate_limited beyond it)."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if key is None:
        raise GatewayError(401, "unauthorized", f"Missing API key: send {how}", headers=challenge)
    try:
        tenant = await key_store.authenticate(key)
    except KeyStoreUnavailable as exc:
        raise GatewayError(
            503,
            "auth_unavailable",
            "API keys cannot be checked right now; retry later.",
            retry_after=settings.default_retry_after_seconds,
        ) from exc
    if tenant is None:
        raise GatewayError(401, "unauthorized", "Invalid API key", headers=challenge)
    admission.count_request(tenant, settings.replicas)
    return tenant


async def get_current_tenant(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    key_store: KeyStoreDep,
    settings: SettingsDep,
    admission: AdmissionDep,
) -> Tenant:
    """The caller's tenant, by its bearer key."""
    key = credentials.credentials if credentials is not None else None
    return await authenticate(key, key_store, settings, admission)


CurrentTenant = Annotated[Tenant, Depends(get_current_tenant)]


def execution_context_of(
    tenant_dependency: Callable[..., Awaitable[Tenant]],
) -> Callable[..., Awaitable[ExecutionContext]]:
    """The execution use cases' context, for the tenant `tenant_dependency` authenticates."""

    async def get_context(
        tenant: Annotated[Tenant, Depends(tenant_dependency)],
        executions: ExecutionServiceDep,
        catalog: CatalogDep,
        settings: SettingsDep,
        admission: AdmissionDep,
        direct: DirectRunnerDep,
        counts: TenantCountsDep,
    ) -> ExecutionContext:
        return ExecutionContext(tenant, executions, catalog, settings, admission, direct, counts)

    return get_context


get_execution_context = execution_context_of(get_current_tenant)


ExecutionContextDep = Annotated[ExecutionContext, Depends(get_execution_context)]


def session_context_of(
    tenant_dependency: Callable[..., Awaitable[Tenant]],
) -> Callable[..., Awaitable[SessionContext]]:
    """The session use cases' context: execution_context_of's, with the sessions."""

    async def get_context(
        ctx: Annotated[ExecutionContext, Depends(execution_context_of(tenant_dependency))],
        sessions: SessionServiceDep,
        known: KnownSessionsDep,
    ) -> SessionContext:
        return SessionContext.of(ctx, sessions, known)

    return get_context


get_session_context = session_context_of(get_current_tenant)


SessionContextDep = Annotated[SessionContext, Depends(get_session_context)]
