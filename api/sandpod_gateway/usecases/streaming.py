"""Streaming: an execution's output as Server-Sent Events."""

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

from fastapi.sse import ServerSentEvent
from sandpod_contract.runner import LiveOutput

from sandpod_gateway.kube.resources import Resource, execution_result
from sandpod_gateway.kube.service import ExecutionNotFound, ExecutionService, KubernetesUnavailable
from sandpod_gateway.schemas import ExecutionResult, OutputEvent
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.executions import CreateOutcome
from sandpod_gateway.usecases.waiting import finished, wait_timeout
from sandpod_gateway.web.errors import GatewayError

logger = logging.getLogger(__name__)


def _replayed_output(result: ExecutionResult) -> Iterator[ServerSentEvent]:
    if result.stdout:
        yield ServerSentEvent(event="stdout", data=OutputEvent(data=result.stdout))
    if result.stderr:
        yield ServerSentEvent(event="stderr", data=OutputEvent(data=result.stderr))


async def execution_events(
    resource: Resource, namespace: str, service: ExecutionService, settings: GatewaySettings
) -> AsyncIterator[ServerSentEvent]:
    """SSE events of one execution: stdout/stderr chunks live from the pod log, then exit
    with the result. If the pod is gone already, the output kept in the status is replayed.

    The answer has started when anything goes wrong, so errors become an `error` event."""
    name = resource["metadata"]["name"]
    streamed = False
    # A session's pod log holds every run of the session and does not end with this one:
    # its output is replayed from the status once it has finished.
    in_session = bool((resource.get("spec") or {}).get("session"))
    try:
        if not in_session:
            async for chunk in service.stream(namespace, name, wait_timeout(resource, settings)):
                streamed = True
                yield ServerSentEvent(event=chunk.stream, data=OutputEvent(data=chunk.data))
        resource = await finished(resource, namespace, service, settings)
    except (KubernetesUnavailable, ExecutionNotFound) as exc:
        logger.warning("stream of %s/%s ended early: %s", namespace, name, exc)
        code = "not_found" if isinstance(exc, ExecutionNotFound) else "kubernetes_unavailable"
        yield ServerSentEvent(event="error", data={"code": code, "message": str(exc)})
        return
    result = execution_result(resource)
    if not streamed:
        for event in _replayed_output(result):
            yield event
    yield ServerSentEvent(event="exit", data=result)


async def live_events(
    live: LiveOutput, running: "asyncio.Future[CreateOutcome]"
) -> AsyncIterator[ServerSentEvent]:
    """SSE events of a run started with `live.put` as its output listener: stdout/stderr
    chunks as its runner sends them (the direct path), then exit with the result. A run
    that streamed nothing (the record path took it) has its output replayed from the result.
    """
    streamed = False
    try:
        async for chunk in live.chunks(running):
            streamed = True
            yield ServerSentEvent(event=chunk.stream, data=OutputEvent(data=chunk.data))
        result = running.result().result
    except GatewayError as exc:
        yield ServerSentEvent(event="error", data={"code": exc.code, "message": exc.message})
        return
    if not streamed:
        for event in _replayed_output(result):
            yield event
    yield ServerSentEvent(event="exit", data=result)
