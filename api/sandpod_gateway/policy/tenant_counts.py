"""A tenant's counts, asked of the operator: it keeps them in memory from its watches and
admits each create of every gateway replica (sandpod_operator/admission), so maxConcurrent,
maxSessions and maxStoredBytes hold across replicas with no lock and no LIST here.

When the operator cannot be asked, a create is refused with 503 admission_unavailable (a
guess from this replica alone could let the tenant past its limits).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from sandpod_contract.names import DIRECT_ADMISSION_PATH, DIRECT_USAGE_PATH

from sandpod_gateway.kube.operator_endpoint import OperatorEndpoint
from sandpod_gateway.policy.admission import (
    concurrency_refused,
    seconds_until_room,
    session_limit_refused,
    stored_bytes_refused,
)
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.web.errors import GatewayError

logger = logging.getLogger(__name__)

ASK_TIMEOUT_SECONDS = 5.0

Kind = Literal["execution", "session"]


@dataclass(frozen=True)
class TenantUsage:
    """What the operator counts for a tenant: executions not finished, sessions not ended,
    bytes its namespace's executions keep."""

    running: int
    sessions: int
    stored_bytes: int
    oldest_running: datetime | None = None

    @classmethod
    def of(cls, fields: Any) -> TenantUsage:
        """From the operator's answer; ValueError when it is not one."""
        if not isinstance(fields, dict):
            raise ValueError("no usage in the answer")
        counts = [fields.get(key) for key in ("running", "sessions", "storedBytes")]
        if not all(isinstance(count, int) for count in counts):
            raise ValueError("the usage lacks a count")
        oldest = fields.get("oldestRunning")
        return cls(
            running=int(counts[0] or 0),
            sessions=int(counts[1] or 0),
            stored_bytes=int(counts[2] or 0),
            oldest_running=datetime.fromisoformat(oldest) if isinstance(oldest, str) else None,
        )


def refusal(
    answer: Any, tenant: Tenant, stored_bytes: int, settings: GatewaySettings
) -> GatewayError:
    """The gateway's 429 for the operator's refusal (`answer`: {limit, value, usage})."""
    fields = answer if isinstance(answer, dict) else {}
    usage = TenantUsage.of(fields.get("usage"))
    limit, value = fields.get("limit"), fields.get("value")
    if not isinstance(value, int):
        raise ValueError("the refusal names no value")
    if limit == "maxConcurrent":
        wait = seconds_until_room(
            usage.oldest_running,
            datetime.now(UTC),
            tenant.limits.max_timeout_seconds,
            settings.default_retry_after_seconds,
        )
        return concurrency_refused(usage.running, 1, value, wait)
    if limit == "maxSessions":
        return session_limit_refused(value, settings)
    if limit == "maxStoredBytes":
        return stored_bytes_refused(usage.stored_bytes, stored_bytes, value, settings)
    raise ValueError(f"an unknown limit {limit!r}")


class OperatorCounts:
    """Asks the operator's ledger, at the direct path's `endpoint`, over one pool of
    kept-alive connections. A gateway without the direct path has none: it counts by
    listing, per replica (admission.py)."""

    def __init__(self, endpoint: OperatorEndpoint, retry_after_seconds: int) -> None:
        self._address = endpoint.address
        self._headers = {"Authorization": f"Bearer {endpoint.token}"}
        self._retry_after = retry_after_seconds
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(ASK_TIMEOUT_SECONDS))

    async def close(self) -> None:
        await self._http.close()

    async def admit(
        self, tenant: Tenant, kind: Kind, name: str, stored_bytes: int, settings: GatewaySettings
    ) -> None:
        """Admit one create of `tenant`, or raise its 429 (503 when the operator cannot say)."""
        limits = tenant.limits
        body = {
            "namespace": tenant.namespace,
            "tenant": tenant.name,
            "kind": kind,
            "name": name,
            "storedBytes": stored_bytes,
            "limits": {
                "maxConcurrent": limits.max_concurrent,
                "maxSessions": limits.max_sessions,
                "maxStoredBytes": limits.max_stored_bytes,
            },
        }
        try:
            url = await self._url(DIRECT_ADMISSION_PATH)
            async with self._http.post(url, json=body, headers=self._headers) as response:
                status, answer = response.status, await response.json(content_type=None)
            if status == 200 and isinstance(answer, dict) and answer.get("admitted") is True:
                return
            if status == 429:
                error = refusal(answer, tenant, stored_bytes, settings)
            else:
                raise ValueError(f"the operator answered {status}: {answer!r}")
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise self._unavailable(exc) from exc
        raise error

    async def usage(self, tenant: Tenant) -> TenantUsage:
        """The tenant's use as the operator counts it (503 when it cannot say)."""
        query = {"namespace": tenant.namespace, "tenant": tenant.name}
        try:
            url = await self._url(DIRECT_USAGE_PATH)
            async with self._http.get(url, params=query, headers=self._headers) as response:
                status, answer = response.status, await response.json(content_type=None)
            if status != 200 or not isinstance(answer, dict):
                raise ValueError(f"the operator answered {status}: {answer!r}")
            return TenantUsage.of(answer.get("usage"))
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise self._unavailable(exc) from exc

    async def _url(self, path: str) -> str:
        return (await self._address()).rstrip("/") + path

    def _unavailable(self, exc: Exception) -> GatewayError:
        logger.warning("the operator's admission could not be asked: %s", exc)
        return GatewayError(
            503,
            "admission_unavailable",
            "The tenant's limits cannot be checked right now (the operator is not reachable); "
            "nothing was created, retry later.",
            retry_after=self._retry_after,
        )
