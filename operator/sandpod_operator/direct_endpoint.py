"""The operator's endpoint of the direct path, `POST /v1/session-runs`, for the gateway alone:
it presents a token only the two hold (a Secret of the chart), and a NetworkPolicy admits
only the gateway's pods to this port. The body is the gateway's CodeExecution (admitted, its
name and labels decided there) and its namespace; the answer is its record with the final
status, or a refusal the gateway maps to its own errors.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from sandpod_contract.names import DIRECT_RUN_PATH

from sandpod_operator.kube import Manifest
from sandpod_operator.sessions import InvalidRun, NotServing, SessionBusy

# (namespace, name) -> the session as the operator last saw it, or None.
SessionLookup = Callable[[str, str], Manifest | None]


class Runs(Protocol):
    """What runs a direct run (direct.DirectRuns)."""

    async def run(self, namespace: str, execution: Manifest, session: Manifest) -> Manifest: ...


MAX_BODY_BYTES = 4 * 1024 * 1024
STARTING_POLL_SECONDS = 0.05


def refusal(status: int, reason: str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"reason": reason, "message": message}, status=status, headers=headers or None
    )


def parse_run(body: Any) -> tuple[str, Manifest, str] | None:
    """(namespace, execution, session name) of a well-formed body, else None."""
    if not isinstance(body, dict):
        return None
    namespace, execution = body.get("namespace"), body.get("execution")
    if not isinstance(namespace, str) or not isinstance(execution, dict):
        return None
    name = (execution.get("metadata") or {}).get("name")
    session = (execution.get("spec") or {}).get("session")
    if not isinstance(name, str) or not isinstance(session, str) or not name or not session:
        return None
    return namespace, execution, session


async def once_started(
    sessions: SessionLookup, namespace: str, name: str, wait_seconds: float
) -> Manifest | None:
    """The session, once it is no longer starting (or `wait_seconds` have passed): a run
    sent right after the session was opened waits for its sandbox, as on the record path."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while True:
        session = sessions(namespace, name)
        phase = ((session or {}).get("status") or {}).get("phase")
        if session is None or phase not in (None, "Starting") or loop.time() >= deadline:
            return session
        await asyncio.sleep(STARTING_POLL_SECONDS)


def create_app(
    runs: Runs, token: str, sessions: SessionLookup, starting_wait_seconds: float
) -> web.Application:
    expected = f"Bearer {token}".encode()

    async def post_run(request: web.Request) -> web.Response:
        presented = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(presented, expected):
            return refusal(401, "Unauthorized", "a valid token is required")
        try:
            parsed = parse_run(await request.json())
        except ValueError:
            parsed = None
        if parsed is None:
            return refusal(400, "BadRequest", "namespace and a named execution in a session")
        namespace, execution, session_name = parsed
        session = await once_started(sessions, namespace, session_name, starting_wait_seconds)
        if session is None:
            return refusal(404, "SessionNotFound", f"no session {session_name!r}")
        try:
            record = await runs.run(namespace, execution, session)
        except NotServing as error:
            return refusal(409, "NotServing", str(error))
        except InvalidRun as error:
            return refusal(422, "InvalidSpec", str(error))
        except SessionBusy as error:
            return refusal(429, "SessionBusy", str(error), **{"Retry-After": "1"})
        return web.json_response({"execution": record})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(DIRECT_RUN_PATH, post_run)
    return app


async def start(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host="0.0.0.0", port=port).start()
    return runner
