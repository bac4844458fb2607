"""The operator's direct port, where the gateway posts direct runs and asks for admissions:
its address (by its Service, read through the Kubernetes API, or a URL) and the token it
expects."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from sandpod_gateway.settings import GatewaySettings


class ServiceAddress:
    """The operator's direct path by its Service (`namespace/name:port`), read once through
    the Kubernetes API: its cluster IP needs no DNS, which a gateway whose egress is confined
    to the API server and the operator does not have."""

    def __init__(self, api_client: ApiClient, service: str) -> None:
        reference, _, port = service.rpartition(":")
        self._namespace, _, self._name = reference.partition("/")
        self._port = int(port)
        self._core = CoreV1Api(api_client)
        self._url: str | None = None

    async def __call__(self) -> str:
        if self._url is None:
            found = await self._core.read_namespaced_service(self._name, self._namespace)
            self._url = f"http://{found.spec.cluster_ip}:{self._port}"
        return self._url


@dataclass(frozen=True)
class OperatorEndpoint:
    """The operator's direct port as the settings name it: its base URL, and the token."""

    address: Callable[[], Awaitable[str]]
    token: str

    @classmethod
    def of(cls, settings: GatewaySettings, api_client: ApiClient) -> OperatorEndpoint | None:
        """Its Service, else its URL; None without a token or either."""
        if not settings.direct_token_file:
            return None
        address: Callable[[], Awaitable[str]]
        if settings.direct_service:
            address = ServiceAddress(api_client, settings.direct_service)
        elif settings.direct_url:
            address = partial(_fixed, settings.direct_url)
        else:
            return None
        return cls(address, Path(settings.direct_token_file).read_text().strip())


async def _fixed(url: str) -> str:
    return url
