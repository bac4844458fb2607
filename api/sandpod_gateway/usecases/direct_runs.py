"""The gateway's side of the direct path: a run in a live session, or a one-off run that a
ready pool sandbox can take, is posted to the operator's endpoint
(sandpod_operator/serving/endpoint.py), which runs it on that sandbox's runner at once and
answers with its record (the CodeExecution written behind, final status included). No
write to the API server is waited on; runner credentials stay with the operator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from sandpod_contract.names import DIRECT_POOL_RUN_PATH, DIRECT_RUN_PATH

from sandpod_gateway.kube.operator_endpoint import OperatorEndpoint
from sandpod_gateway.kube.resources import Resource
from sandpod_gateway.kube.service import SessionNotFound
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.web.errors import GatewayError

# Beyond the run's own timeout: the operator's turn queue and the record of outputs.
ANSWER_MARGIN_SECONDS = 60


class NotServingNow(Exception):
    """The direct path cannot take this run (the session is starting, or the operator was
    not reached): the caller takes the record path, which queues it."""


class DirectRunner(Protocol):
    async def run(self, namespace: str, execution: Resource, timeout_seconds: int) -> Resource:
        """The run's record with its final status; NotServingNow, or a GatewayError."""
        ...

    async def close(self) -> None: ...


class OperatorDirectRunner:
    """Posts runs to the operator's direct endpoint over one pool of kept-alive connections.
    `address` gives its base URL (http://host:port)."""

    def __init__(
        self, address: Callable[[], Awaitable[str]], token: str, retry_after_seconds: int
    ) -> None:
        self._address = address
        self._headers = {"Authorization": f"Bearer {token}"}
        self._retry_after = str(retry_after_seconds)
        self._http = aiohttp.ClientSession()

    @classmethod
    def of(cls, settings: GatewaySettings, api_client: ApiClient) -> OperatorDirectRunner | None:
        """The direct path the settings name (its Service, else its URL), or None."""
        endpoint = OperatorEndpoint.of(settings, api_client)
        if endpoint is None:
            return None
        return cls(endpoint.address, endpoint.token, settings.default_retry_after_seconds)

    async def close(self) -> None:
        await self._http.close()

    async def run(self, namespace: str, execution: Resource, timeout_seconds: int) -> Resource:
        body = {"namespace": namespace, "execution": execution}
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + ANSWER_MARGIN_SECONDS)
        try:
            url = (await self._address()).rstrip("/") + _path(execution)
        except (ApiException, aiohttp.ClientError, OSError) as exc:  # nothing was run
            raise NotServingNow(f"the operator's address is unknown: {exc}") from exc
        try:
            async with self._http.post(
                url, json=body, headers=self._headers, timeout=timeout
            ) as response:
                answer = await response.json(content_type=None)
                status = response.status
                retry_after = response.headers.get("Retry-After", self._retry_after)
        except aiohttp.ClientConnectorError as exc:  # never reached: nothing was run
            raise NotServingNow(str(exc)) from exc
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise self._unavailable() from exc
        return self._answer(status, answer, retry_after, execution)

    def _answer(
        self, status: int, answer: object, retry_after: str, execution: Resource
    ) -> Resource:
        fields = answer if isinstance(answer, dict) else {}
        message = str(fields.get("message") or "")
        if status == 200 and isinstance(fields.get("execution"), dict):
            record: Resource = fields["execution"]
            return record
        if status == 409:
            raise NotServingNow(message)
        session = (execution.get("spec") or {}).get("session")
        if status == 404 and session:
            raise SessionNotFound(str(session))
        if status == 422:
            raise GatewayError(422, "invalid_execution", f"The sandbox refused the run: {message}")
        if status == 429:
            raise GatewayError(
                429,
                "session_busy",
                f"The session has too many runs waiting ({message}); retry later.",
                headers={"Retry-After": retry_after},
            )
        raise self._unavailable()

    def _unavailable(self) -> GatewayError:
        return GatewayError(
            503,
            "unavailable",
            "The run could not be completed; retry with the same Idempotency-Key "
            "to get its result without running it again.",
            headers={"Retry-After": self._retry_after},
        )


def _path(execution: Resource) -> str:
    return DIRECT_RUN_PATH if (execution.get("spec") or {}).get("session") else DIRECT_POOL_RUN_PATH
