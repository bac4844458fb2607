"""The operator's endpoint of the direct path, `POST /v1/session-runs` and `/v1/pool-runs`, for
the gateway alone: it presents a token only the two hold (a Secret of the chart), and a
NetworkPolicy admits only the gateway's pods to this port. The body is the gateway's
CodeExecution (admitted, its name and labels decided there) and its namespace; the answer is
its record with the final status, or a refusal the gateway maps to its own errors.

A request that accepts `application/x-ndjson` gets the output live once the program writes
some: one line `{"output": {"stream", "data"}}` per frame as the runner sends it (unverified,
as live output is everywhere), then `{"execution": record}` (verified), or `{"error": why}`.
A run that ends before writing anything, and every refusal, is answered as without it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import web
from sandpod_contract.names import (
    DIRECT_CANCEL_PATH,
    DIRECT_POOL_RUN_PATH,
    DIRECT_RUN_PATH,
    NDJSON_MEDIA_TYPE,
)
from sandpod_contract.runner import LiveOutput, OutputListener

from sandpod_operator.kube import Manifest
from sandpod_operator.serving.core import InvalidRun, NotServing
from sandpod_operator.serving.direct import DirectRuns
from sandpod_operator.sessions.controller import SessionBusy

# (namespace, name) -> the session as the operator last saw it, or None.
SessionLookup = Callable[[str, str], Manifest | None]
# namespace -> its SandboxPools and their pods, as the operator last saw them.
PoolLookup = Callable[[str], tuple[list[Manifest], list[Manifest]]]


# A run, started with who wants its output live (or None).
Start = Callable[[OutputListener | None], Awaitable[Manifest]]


MAX_BODY_BYTES = 4 * 1024 * 1024
STARTING_POLL_SECONDS = 0.05
UNSEEN_WAIT_SECONDS = 5.0


def refusal(status: int, reason: str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"reason": reason, "message": message}, status=status, headers=headers or None
    )


def parse_run(body: Any) -> tuple[str, Manifest, str | None] | None:
    """(namespace, execution, session name or None) of a well-formed body, else None."""
    if not isinstance(body, dict):
        return None
    namespace, execution = body.get("namespace"), body.get("execution")
    if not isinstance(namespace, str) or not isinstance(execution, dict):
        return None
    name = (execution.get("metadata") or {}).get("name")
    session = (execution.get("spec") or {}).get("session")
    if not isinstance(name, str) or not name or not isinstance(session, str | None):
        return None
    return namespace, execution, session or None


async def once_started(
    sessions: SessionLookup,
    namespace: str,
    name: str,
    wait_seconds: float,
    unseen_wait_seconds: float = UNSEEN_WAIT_SECONDS,
) -> Manifest | None:
    """The session, once it is no longer starting (or `wait_seconds` have passed): a run
    sent right after the session was opened waits for its sandbox, as on the record path.
    One this process has not seen yet (the gateway just read it from the API; the watch
    may lag) is waited for `unseen_wait_seconds`, then None."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        session = sessions(namespace, name)
        phase = ((session or {}).get("status") or {}).get("phase")
        waited = loop.time() - started
        if session is None and waited >= unseen_wait_seconds:
            return None
        if session is not None and (phase not in (None, "Starting") or waited >= wait_seconds):
            return session
        await asyncio.sleep(STARTING_POLL_SECONDS)


def create_app(
    runs: DirectRuns,
    token: str,
    sessions: SessionLookup,
    pools: PoolLookup,
    starting_wait_seconds: float,
    unseen_wait_seconds: float = UNSEEN_WAIT_SECONDS,
) -> web.Application:
    """POST /v1/session-runs (a run in a session) and /v1/pool-runs (a one-off run in a free
    pool pod): the record with its final status, or a refusal."""
    expected = f"Bearer {token}".encode()

    async def parsed_run(request: web.Request) -> tuple[str, Manifest, str | None] | None:
        try:
            return parse_run(await request.json())
        except ValueError:
            return None

    async def answer(running: Awaitable[Manifest]) -> web.Response:
        try:
            record = await running
        except NotServing as error:
            return refusal(409, "NotServing", str(error))
        except InvalidRun as error:
            return refusal(422, "InvalidSpec", str(error))
        except SessionBusy as error:
            return refusal(429, "SessionBusy", str(error), **{"Retry-After": "1"})
        return web.json_response({"execution": record})

    async def post_session_run(request: web.Request) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return refusal(401, "Unauthorized", "a valid token is required")
        parsed = await parsed_run(request)
        if parsed is None or parsed[2] is None:
            return refusal(400, "BadRequest", "namespace and a named execution in a session")
        namespace, execution, session_name = parsed[0], parsed[1], parsed[2]
        session = await once_started(
            sessions, namespace, session_name, starting_wait_seconds, unseen_wait_seconds
        )
        if session is None:
            return refusal(404, "SessionNotFound", f"no session {session_name!r}")
        return await respond(request, partial(runs.run, namespace, execution, session))

    async def post_pool_run(request: web.Request) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return refusal(401, "Unauthorized", "a valid token is required")
        parsed = await parsed_run(request)
        if parsed is None or parsed[2] is not None:
            return refusal(400, "BadRequest", "namespace and a named execution in no session")
        namespace, execution, _ = parsed
        return await respond(
            request, partial(runs.run_from_pool, namespace, execution, *pools(namespace))
        )

    async def post_cancel(request: web.Request) -> web.Response:
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return refusal(401, "Unauthorized", "a valid token is required")
        try:
            body = await request.json()
        except ValueError:
            body = None
        fields = body if isinstance(body, dict) else {}
        namespace, name = fields.get("namespace"), fields.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return refusal(400, "BadRequest", "the namespace and name of a run")
        if not await runs.cancel(namespace, name):
            return refusal(404, "NotRunning", f"no run {name!r} in progress here")
        return web.json_response({}, status=202)

    async def respond(request: web.Request, start: Start) -> web.StreamResponse:
        if NDJSON_MEDIA_TYPE not in request.headers.get("Accept", ""):
            return await answer(start(None))
        return await answer_live(request, start, answer)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(DIRECT_RUN_PATH, post_session_run)
    app.router.add_post(DIRECT_POOL_RUN_PATH, post_pool_run)
    app.router.add_post(DIRECT_CANCEL_PATH, post_cancel)
    return app


async def answer_live(
    request: web.Request,
    start: Start,
    answer: Callable[[Awaitable[Manifest]], Awaitable[web.Response]],
) -> web.StreamResponse:
    """The run's output line by line as it comes, then its record; `answer` answers a run
    that ends (or is refused) before any output, as a request without live output."""
    live = LiveOutput()
    running = asyncio.ensure_future(start(live.put))
    if not await live.started(running):
        return await answer(running)
    response = web.StreamResponse(headers={"Content-Type": NDJSON_MEDIA_TYPE})
    await response.prepare(request)
    # A caller gone mid-answer: the run goes on and is recorded (LiveOutput.chunks).
    async for chunk in live.chunks(running):
        await response.write(_ndjson({"output": {"stream": chunk.stream, "data": chunk.data}}))
    await response.write(_ndjson(_final(running)))
    await response.write_eof()
    return response


def _final(running: asyncio.Future[Manifest]) -> dict[str, Any]:
    error = running.exception()
    if error is not None:
        return {"error": type(error).__name__}
    return {"execution": running.result()}


def _ndjson(line: dict[str, Any]) -> bytes:
    return json.dumps(line).encode() + b"\n"


async def start(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host="0.0.0.0", port=port).start()
    return runner
