"""/healthz (the process is up), /readyz (it can serve), /metrics (Prometheus)."""

import logging
from typing import Literal

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from sandpod_gateway.kube.service import KubernetesUnavailable
from sandpod_gateway.policy.auth import KeyStoreUnavailable
from sandpod_gateway.web.dependencies import ExecutionServiceDep, KeyStoreDep, MetricsDep
from sandpod_gateway.web.errors import GatewayError, error_responses

logger = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


class HealthStatus(BaseModel):
    status: Literal["ok", "ready"]


@router.get("/healthz", response_model=HealthStatus, summary="Liveness")
async def healthz() -> HealthStatus:
    return HealthStatus(status="ok")


@router.get(
    "/readyz",
    response_model=HealthStatus,
    summary="Readiness: API keys loaded and CodeExecutions served by the cluster",
    responses=error_responses(503),
)
async def readyz(key_store: KeyStoreDep, service: ExecutionServiceDep) -> HealthStatus:
    # The answer names the part that is missing, never a namespace, name or error text:
    # /readyz is reachable without a key.
    try:
        await key_store.check_ready()
    except KeyStoreUnavailable as exc:
        logger.warning("not ready: %s", exc)
        raise GatewayError(503, "not_ready", "Not ready: the API keys cannot be loaded") from exc
    try:
        await service.check_ready()
    except KubernetesUnavailable as exc:
        logger.warning("not ready: %s", exc)
        raise GatewayError(
            503, "not_ready", "Not ready: the cluster does not serve executions"
        ) from exc
    return HealthStatus(status="ready")


@router.get("/metrics", include_in_schema=False)
async def metrics(gateway_metrics: MetricsDep) -> Response:
    return Response(generate_latest(gateway_metrics.registry), media_type=CONTENT_TYPE_LATEST)
