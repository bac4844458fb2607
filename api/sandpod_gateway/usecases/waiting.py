"""Waiting: how long a request waits for an execution, and the wait itself."""

from sandpod_gateway.kube.resources import Resource, is_terminal
from sandpod_gateway.kube.service import ExecutionService
from sandpod_gateway.settings import GatewaySettings


def wait_timeout(resource: Resource, settings: GatewaySettings) -> float:
    """The execution's own timeout plus the margin for scheduling and sandbox start."""
    timeout = (resource.get("spec") or {}).get("timeoutSeconds")
    seconds = timeout if isinstance(timeout, int) else settings.default_timeout_seconds
    return seconds + settings.wait_margin_seconds


async def finished(
    resource: Resource, namespace: str, service: ExecutionService, settings: GatewaySettings
) -> Resource:
    """The execution once it has finished, or as it is when the wait ends."""
    if is_terminal(resource):
        return resource
    name = resource["metadata"]["name"]
    return await service.wait(namespace, name, wait_timeout(resource, settings))
