"""The gateway's admission by the operator's ledger (sandpod_gateway/policy/tenant_counts.py):
the operator's own endpoint (sandpod_operator/admission) served on a local port, asked by two
clients as two gateway replicas would; its indices played by plain lists."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from gateway_fakes import FakeExecutionService, http_client, make_app, tenant
from sandpod_gateway.kube.operator_endpoint import OperatorEndpoint
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.policy.tenant_counts import OperatorCounts
from sandpod_gateway.settings import GatewaySettings
from sandpod_gateway.web.dependencies import get_tenant_counts
from sandpod_gateway.web.errors import GatewayError
from sandpod_operator.admission.endpoint import add_routes
from sandpod_operator.admission.ledger import ExecutionUse, Ledger, SessionUse

TOKEN = "direct-token-0123456789"
ALICE = "sk-alice-0123456789"


class Operator:
    """The operator's admission endpoint on a port of its own, and what its indices hold."""

    def __init__(self) -> None:
        self.executions: dict[str, list[ExecutionUse]] = {}
        self.sessions: dict[str, list[SessionUse]] = {}
        self.ledger = Ledger(
            executions=lambda namespace: self.executions.get(namespace, []),
            sessions=lambda namespace: self.sessions.get(namespace, []),
        )
        self.url = ""
        self.counted = True

    def counts(self, token: str = TOKEN) -> OperatorCounts:
        return OperatorCounts(OperatorEndpoint(self.address, token), retry_after_seconds=3)

    async def address(self) -> str:
        return self.url


# On the test's own loop (this suite's async fixtures default to the session's).
@pytest_asyncio.fixture(loop_scope="function")
async def operator() -> AsyncIterator[Operator]:
    served = Operator()
    app = web.Application()
    add_routes(app, served.ledger, TOKEN, counted=lambda: served.counted)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host="127.0.0.1", port=0)
    await site.start()
    host, port = runner.addresses[0][:2]
    served.url = f"http://{host}:{port}"
    try:
        yield served
    finally:
        await runner.cleanup()


def alice(**limits: int) -> Tenant:
    return tenant("alice", "ns-alice", **limits)


async def admit_all(
    replicas: list[OperatorCounts], who: Tenant, names: list[str], kind: str = "execution"
) -> list[GatewayError | None]:
    settings = GatewaySettings()

    async def one(index: int, name: str) -> GatewayError | None:
        counts = replicas[index % len(replicas)]
        try:
            if kind == "session":
                await counts.admit(who, "session", name, 0, settings)
            else:
                await counts.admit(who, "execution", name, 100, settings)
        except GatewayError as error:
            return error
        return None

    return await asyncio.gather(*(one(i, name) for i, name in enumerate(names)))


async def test_creates_through_two_replicas_at_once_keep_max_concurrent(
    operator: Operator,
) -> None:
    replicas = [operator.counts(), operator.counts()]
    try:
        answers = await admit_all(replicas, alice(max_concurrent=3), [f"cx-{i}" for i in range(12)])
    finally:
        for counts in replicas:
            await counts.close()

    refused = [answer for answer in answers if answer is not None]
    assert len(refused) == 9
    assert {(error.status_code, error.code) for error in refused} == {(429, "concurrency_limit")}
    assert all(error.details[0].limit == 3 for error in refused)
    assert all(int(error.headers["Retry-After"]) >= 1 for error in refused)


async def test_sessions_through_two_replicas_keep_max_sessions(operator: Operator) -> None:
    operator.sessions["ns-alice"] = [SessionUse("old", "alice", live=True)]
    replicas = [operator.counts(), operator.counts()]
    try:
        answers = await admit_all(
            replicas, alice(max_sessions=3), [f"s-{i}" for i in range(8)], kind="session"
        )
    finally:
        for counts in replicas:
            await counts.close()

    refused = [answer for answer in answers if answer is not None]
    assert len(refused) == 6
    assert {error.code for error in refused} == {"session_limit"}


async def test_a_create_over_the_stored_bytes_is_refused_naming_the_limit(
    operator: Operator,
) -> None:
    operator.executions["ns-alice"] = [ExecutionUse("old", "alice", False, 950)]
    counts = operator.counts()
    try:
        with pytest.raises(GatewayError) as refused:
            await counts.admit(
                alice(max_stored_bytes=1000), "execution", "cx-1", 100, GatewaySettings()
            )
        usage = await counts.usage(alice())
    finally:
        await counts.close()

    error = refused.value
    assert (error.status_code, error.code) == (429, "stored_bytes_limit")
    assert "maxStoredBytes" in error.message and "950" in error.message
    assert (error.details[0].type, error.details[0].limit) == ("max_stored_bytes", 1000)
    assert (usage.running, usage.sessions, usage.stored_bytes) == (0, 0, 950)


async def test_an_operator_not_reached_refuses_with_503(operator: Operator) -> None:
    clients = [
        OperatorCounts(OperatorEndpoint(_closed_port, TOKEN), retry_after_seconds=3),
        operator.counts(token="not-the-token-0123456789"),
        # Just restarted: its indices are not populated yet.
        operator.counts(),
    ]
    operator.counted = False
    try:
        for counts in clients:
            with pytest.raises(GatewayError) as refused:
                await counts.admit(alice(), "execution", "cx-1", 100, GatewaySettings())
            error = refused.value
            assert (error.status_code, error.code) == (503, "admission_unavailable")
            assert error.headers["Retry-After"] == "3"
    finally:
        for counts in clients:
            await counts.close()
    assert operator.ledger.usage("ns-alice", "alice").running == 0


async def _closed_port() -> str:
    return "http://127.0.0.1:9"


async def test_the_gateway_asks_the_operator_and_shows_the_use(
    operator: Operator, tmp_path: Path
) -> None:
    service = FakeExecutionService()
    app = make_app(service, {ALICE: alice(max_concurrent=1)}, kubeconfig_dir=tmp_path)
    counts = operator.counts()
    app.dependency_overrides[get_tenant_counts] = lambda: counts
    body = {"language": "python", "code": "print(1)"}
    try:
        async with http_client(app, ALICE) as client:
            first = await client.post("/v1/executions?wait=false", json=body)
            second = await client.post("/v1/executions?wait=false", json=body)
            operator.executions["ns-alice"] = [ExecutionUse(first.json()["id"], "alice", True, 321)]
            info = (await client.get("/v1/tenant")).json()
    finally:
        await counts.close()

    assert first.status_code == 202
    assert (second.status_code, second.json()["error"]["code"]) == (429, "concurrency_limit")
    assert info["usage"] == {"running": 1, "sessions": 0, "stored_bytes": 321}
    assert info["limits"]["max_stored_bytes"] == 256 * 1024 * 1024
