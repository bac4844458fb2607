"""The gateway's side of the direct path: a run in a live session, or a one-off run that a
ready pool sandbox can take, is posted to the operator's endpoint
(sandpod_operator/serving/endpoint.py), which runs it on that sandbox's runner at once and
answers with its record (the CodeExecution written behind, final status included). No
write to the API server is waited on; runner credentials stay with the operator.

A caller that wants the output live passes `on_output`: the operator then streams the run's
output frames as its runner sends them (unverified, as live output is), before the record.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from sandpod_contract.names import (
    DIRECT_CANCEL_PATH,
    DIRECT_POOL_RUN_PATH,
    DIRECT_RUN_PATH,
    NDJSON_MEDIA_TYPE,
)
from sandpod_contract.runner import OutputChunk, OutputListener

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


class DirectRunner:
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
    def of(cls, settings: GatewaySettings, api_client: ApiClient) -> DirectRunner | None:
        """The direct path the settings name (its Service, else its URL), or None."""
        endpoint = OperatorEndpoint.of(settings, api_client)
        if endpoint is None:
            return None
        return cls(endpoint.address, endpoint.token, settings.default_retry_after_seconds)

    async def close(self) -> None:
        await self._http.close()

    async def run(
        self,
        namespace: str,
        execution: Resource,
        timeout_seconds: int,
        on_output: OutputListener | None = None,
    ) -> Resource:
        """The run's record with its final status; NotServingNow, or a GatewayError.
        `on_output` sees its output as it comes."""
        body = {"namespace": namespace, "execution": execution}
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + ANSWER_MARGIN_SECONDS)
        headers = (
            self._headers if on_output is None else {**self._headers, "Accept": NDJSON_MEDIA_TYPE}
        )
        try:
            url = (await self._address()).rstrip("/") + _path(execution)
        except (ApiException, aiohttp.ClientError, OSError) as exc:  # nothing was run
            raise NotServingNow(f"the operator's address is unknown: {exc}") from exc
        try:
            async with self._http.post(
                url, json=body, headers=headers, timeout=timeout
            ) as response:
                status = response.status
                retry_after = response.headers.get("Retry-After", self._retry_after)
                if on_output is not None and response.content_type == NDJSON_MEDIA_TYPE:
                    answer = await _streamed(response, on_output)
                else:
                    answer = await response.json(content_type=None)
        except aiohttp.ClientConnectorError as exc:  # never reached: nothing was run
            raise NotServingNow(str(exc)) from exc
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise self._unavailable() from exc
        return self._answer(status, answer, retry_after, execution)

    async def cancel(self, namespace: str, name: str) -> bool:
        """Stop the direct run of that name in progress: whether one was."""
        body = {"namespace": namespace, "name": name}
        try:
            url = (await self._address()).rstrip("/") + DIRECT_CANCEL_PATH
            async with self._http.post(url, json=body, headers=self._headers) as response:
                status = response.status
        except (ApiException, aiohttp.ClientError, OSError) as exc:
            raise self._unavailable() from exc
        if status not in (202, 404):
            raise self._unavailable()
        return status == 202

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
                retry_after=retry_after,
            )
        raise self._unavailable()

    def _unavailable(self) -> GatewayError:
        return GatewayError(
            503,
            "unavailable",
            "The run could not be completed; retry with the same Idempotency-Key "
            "to get its result without running it again.",
            retry_after=self._retry_after,
        )


async def _streamed(response: aiohttp.ClientResponse, on_output: OutputListener) -> object:
    """A live answer: each output line to `on_output`, then the last line, the answer (a
    record can be longer than aiohttp reads as one line)."""
    pending = bytearray()
    async for data in response.content.iter_any():
        pending += data
        while (end := pending.find(b"\n")) >= 0:
            message = json.loads(pending[:end])
            del pending[: end + 1]
            output = message.get("output") if isinstance(message, dict) else None
            if not isinstance(output, dict):
                return message
            stream, text = output.get("stream"), output.get("data")
            if stream in ("stdout", "stderr") and isinstance(text, str):
                on_output(OutputChunk(stream=stream, data=text))
    raise ValueError("the operator's answer ended before the run's record")


def _path(execution: Resource) -> str:
    return DIRECT_RUN_PATH if (execution.get("spec") or {}).get("session") else DIRECT_POOL_RUN_PATH
