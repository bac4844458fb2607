"""Judge0's callbacks: once a submission with a callback_url is done, the gateway that created
it PUTs the result there (Judge0's default fields, base64-encoded, as Judge0 sends them), to a
host the platform allows (judge0.callback_problem checked it at create).

Best effort, as in Judge0: tried CALLBACK_TRIES times while no answer comes, whatever the answer;
a gateway that stops before the submission is done sends nothing (the result stays readable by
its token).
"""

import asyncio
import logging

import aiohttp

from sandpod_gateway.families.judge0 import judge0
from sandpod_gateway.kube.resources import Resource, is_terminal
from sandpod_gateway.kube.service import ExecutionNotFound, ExecutionService, KubernetesUnavailable
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.usecases.waiting import finished

logger = logging.getLogger(__name__)


class Judge0Callbacks:
    """The callbacks this gateway process owes, each a task until it is sent."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(
        self,
        resource: Resource,
        service: ExecutionService,
        settings: GatewaySettings,
        names: dict[int, str],
    ) -> None:
        record = judge0.record_of(resource)
        if record is None or record.callback_url is None:
            return
        task = asyncio.create_task(
            _call_back(record.callback_url, resource, service, settings, names)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _call_back(
    url: str,
    resource: Resource,
    service: ExecutionService,
    settings: GatewaySettings,
    names: dict[int, str],
) -> None:
    namespace, name = resource["metadata"]["namespace"], resource["metadata"]["name"]
    try:
        done = await finished(resource, namespace, service, settings)
    except (ExecutionNotFound, KubernetesUnavailable) as exc:
        logger.warning("no Judge0 callback for %s/%s: %s", namespace, name, exc)
        return
    if not is_terminal(done):
        logger.warning("no Judge0 callback for %s/%s: it did not finish in time", namespace, name)
        return
    body = judge0.submission_view(done, judge0.DEFAULT_FIELDS, True, names)
    timeout = aiohttp.ClientTimeout(total=judge0.CALLBACK_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for _ in range(judge0.CALLBACK_TRIES):
            try:
                async with http.put(url, json=body, allow_redirects=False):
                    return
            except (aiohttp.ClientError, TimeoutError) as exc:
                logger.info("Judge0 callback for %s/%s failed: %s", namespace, name, exc)
