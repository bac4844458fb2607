"""The ledger on the operator's direct port, for the gateway alone (the same token and
NetworkPolicy as the direct path):

- `POST /v1/admissions` {namespace, tenant, kind, name, storedBytes, limits: {maxConcurrent,
  maxSessions, maxStoredBytes}}: 200 {admitted: true, usage}, or 429 {limit, value, usage}.
- `GET /v1/usage?namespace=&tenant=`: 200 {usage}.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from aiohttp import web
from sandpod_contract.names import DIRECT_ADMISSION_PATH, DIRECT_USAGE_PATH

from sandpod_operator.admission.ledger import Ask, Ledger


def _refusal(status: int, reason: str, message: str) -> web.Response:
    return web.json_response({"reason": reason, "message": message}, status=status)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_ask(body: Any) -> Ask | None:
    """The ask of a well-formed body, else None."""
    if not isinstance(body, dict) or not isinstance(body.get("limits"), dict):
        return None
    limits = body["limits"]
    texts = [body.get(key) for key in ("namespace", "tenant", "name")]
    counts = [
        _count(body.get("storedBytes")),
        _count(limits.get("maxConcurrent")),
        _count(limits.get("maxSessions")),
        _count(limits.get("maxStoredBytes")),
    ]
    kind = body.get("kind")
    if not all(isinstance(text, str) and text for text in texts) or None in counts:
        return None
    if kind not in ("execution", "session"):
        return None
    namespace, tenant, name = (str(text) for text in texts)
    stored, concurrent, sessions, bound = (int(count or 0) for count in counts)
    return Ask(namespace, tenant, kind, name, stored, concurrent, sessions, bound)


def add_routes(
    app: web.Application, ledger: Ledger, token: str, counted: Callable[[], bool]
) -> None:
    """The ledger's routes on `app`; both answer 503 until `counted()` (the indices the
    ledger reads are populated: after a restart they start empty)."""
    expected = f"Bearer {token}".encode()
    not_counted = "the operator has not listed the cluster yet"

    def authorized(request: web.Request) -> bool:
        return hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected)

    async def post_admission(request: web.Request) -> web.Response:
        if not authorized(request):
            return _refusal(401, "Unauthorized", "a valid token is required")
        if not counted():
            return _refusal(503, "NotCounted", not_counted)
        try:
            ask = parse_ask(await request.json())
        except ValueError:
            ask = None
        if ask is None:
            return _refusal(400, "BadRequest", "namespace, tenant, kind, name, storedBytes, limits")
        refused = ledger.admit(ask)
        if refused is None:
            return web.json_response({"admitted": True})
        answer = {"limit": refused.limit, "value": refused.value, "usage": refused.usage.as_json()}
        return web.json_response(answer, status=429)

    async def get_usage(request: web.Request) -> web.Response:
        if not authorized(request):
            return _refusal(401, "Unauthorized", "a valid token is required")
        if not counted():
            return _refusal(503, "NotCounted", not_counted)
        namespace, tenant = request.query.get("namespace"), request.query.get("tenant")
        if not namespace or not tenant:
            return _refusal(400, "BadRequest", "namespace and tenant")
        return web.json_response({"usage": ledger.usage(namespace, tenant).as_json()})

    app.router.add_post(DIRECT_ADMISSION_PATH, post_admission)
    app.router.add_get(DIRECT_USAGE_PATH, get_usage)
