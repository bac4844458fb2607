"""/v1/tenant: the caller's tenant, its limits and defaults."""

from dataclasses import asdict

from fastapi import APIRouter

from sandpod_gateway.policy.admission import default_limits
from sandpod_gateway.schemas import TenantDefaults, TenantInfo, TenantLimitsInfo
from sandpod_gateway.web.dependencies import CurrentTenant, SettingsDep
from sandpod_gateway.web.errors import error_responses

router = APIRouter(prefix="/v1/tenant", tags=["tenant"], responses=error_responses(401, 429, 503))


@router.get("", response_model=TenantInfo, summary="The caller's tenant")
async def get_tenant(tenant: CurrentTenant, settings: SettingsDep) -> TenantInfo:
    """The tenant the API key belongs to, the largest values its requests may ask for, and
    the values a request that names none gets."""
    limits = tenant.limits
    return TenantInfo(
        name=tenant.name,
        limits=TenantLimitsInfo(
            max_timeout_seconds=limits.max_timeout_seconds,
            max_memory=limits.max_memory,
            max_cpu=limits.max_cpu,
            max_concurrent=limits.max_concurrent,
            max_sessions=limits.max_sessions,
            max_idle_timeout_seconds=limits.max_idle_timeout_seconds,
            max_lifetime_seconds=limits.max_lifetime_seconds,
            max_file_bytes=limits.max_file_bytes,
            requests_per_second=limits.requests_per_second,
            request_burst=limits.request_burst,
        ),
        defaults=TenantDefaults(**asdict(default_limits(tenant, settings))),
        max_code_bytes=settings.max_code_bytes,
        lint_rules=tenant.lint,
    )
