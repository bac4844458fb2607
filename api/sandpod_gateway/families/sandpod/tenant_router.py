"""/v1/tenant: the caller's tenant, its limits, its use and defaults."""

from dataclasses import asdict

from fastapi import APIRouter

from sandpod_gateway.policy.admission import default_limits
from sandpod_gateway.schemas import TenantDefaults, TenantInfo, TenantLimitsInfo, TenantUsageInfo
from sandpod_gateway.web.dependencies import CurrentTenant, SettingsDep, TenantCountsDep
from sandpod_gateway.web.errors import GatewayError, error_responses

router = APIRouter(prefix="/v1/tenant", tags=["tenant"], responses=error_responses(401, 429, 503))


@router.get("", response_model=TenantInfo, summary="The caller's tenant")
async def get_tenant(
    tenant: CurrentTenant, settings: SettingsDep, counts: TenantCountsDep
) -> TenantInfo:
    """The tenant the API key belongs to, every bound its requests meet, what it uses now,
    and the values a request that names none gets."""
    usage = None
    if counts is not None:
        try:
            now = await counts.usage(tenant)
        except GatewayError:  # the limits still answer; the use is left out
            now = None
        if now is not None:
            usage = TenantUsageInfo(
                running=now.running, sessions=now.sessions, stored_bytes=now.stored_bytes
            )
    return TenantInfo(
        name=tenant.name,
        limits=TenantLimitsInfo.model_validate(tenant.limits.model_dump()),
        defaults=TenantDefaults(**asdict(default_limits(tenant, settings))),
        max_code_bytes=settings.max_code_bytes,
        usage=usage,
        lint_rules=tenant.lint,
    )
