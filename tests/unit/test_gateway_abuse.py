"""One tenant's abuse must not stall the gateway: the concurrency count reads metadata only,
open waits and streams are bounded per tenant and per execution (429 beyond), a tenant's
maxCpu holds when no cpu is asked for, and /readyz names nothing internal."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from gateway_fakes import FakeExecutionService, make_app, tenant
from sandpod_contract.names import TENANT_LABEL
from sandpod_contract.runner import OutputChunk
from sandpod_gateway.kube.service import KubernetesUnavailable, PageData
from sandpod_gateway.policy.auth import KeyStoreUnavailable, Tenant
from sandpod_gateway.usecases.direct_runs import NotServingNow
from sandpod_gateway.web.dependencies import get_direct_runner, get_key_store

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
SLOW = "import time; time.sleep(20)"


class HeldService(FakeExecutionService):
    """Executions whose source is SLOW wait and stream until `release` is set; the rest
    finish at once. Whole-object lists are a failure: admission must not need them."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.waiting = 0

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        raise AssertionError("admission listed whole objects")

    async def _hold(self, namespace: str, name: str) -> None:
        if self.objects[(namespace, name)]["spec"]["source"] == SLOW:
            self.waiting += 1
            try:
                await self.release.wait()
            finally:
                self.waiting -= 1

    async def wait(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        await self._hold(namespace, name)
        return await super().wait(namespace, name, timeout)

    async def stream(self, namespace: str, name: str, timeout: float) -> AsyncIterator[OutputChunk]:
        yield OutputChunk("stdout", "started\n")
        await self._hold(namespace, name)
        self.finish(namespace, name)


@pytest.fixture
def service() -> HeldService:
    return HeldService()


def app_with(
    service: FakeExecutionService, settings: dict[str, Any] | None = None, **limits: Any
) -> FastAPI:
    keys = {ALICE: tenant("alice", **limits), BOB: tenant("bob")}
    return make_app(service, keys, **(settings or {}))


async def client_of(app: FastAPI, key: str = ALICE) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


async def until(condition: Any) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


def post(client: httpx2.AsyncClient, code: str, key: str | None = None) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/executions", json={"language": "python", "code": code}, headers=headers)


class NoFreePoolSandbox:
    """A gateway's direct path where no pool sandbox is free: every run takes the record path."""

    async def run(
        self, namespace: str, execution: Any, timeout_seconds: int, on_output: Any = None
    ) -> Any:
        raise NotServingNow("no ready sandbox of a pool fits this run now")

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("direct_path", [False, True], ids=["record-path", "direct-path-first"])
async def test_replays_of_one_key_beyond_the_bound_are_429_and_others_still_run(
    service: HeldService, direct_path: bool
) -> None:
    app = app_with(service, max_waits_per_execution=3, max_open_waits=10)
    if direct_path:
        app.dependency_overrides[get_direct_runner] = NoFreePoolSandbox
    async with await client_of(app) as client:
        replays = [asyncio.create_task(post(client, SLOW, "one-key")) for _ in range(40)]
        await until(lambda: sum(task.done() for task in replays) >= 37)
        assert service.waiting == 3

        quick = await post(client, "print(1)")

        assert quick.status_code == 200, quick.text
        assert quick.json()["stdout"] == "print(1)"
        refused = [task.result() for task in replays if task.done()]
        assert {response.status_code for response in refused} == {429}
        error = refused[0].json()["error"]
        assert error["code"] == "too_many_waits"
        assert error["details"][0] == {
            "message": "too many open waits",
            "type": "max_waits_per_execution",
            "limit": 3,
        }
        assert refused[0].headers["Retry-After"] == "5"
        service.release.set()
        answered = await asyncio.gather(*replays)
    assert sum(response.status_code == 200 for response in answered) == 3
    assert len(service.created) == 2  # the held execution once, and print(1)
    assert app.state.admission.open_waits("alice") == 0


async def test_a_tenants_open_waits_are_bounded_and_freed_and_other_tenants_unaffected(
    service: HeldService,
) -> None:
    app = app_with(service, max_open_waits=2, max_concurrent=10)
    async with await client_of(app) as alice, await client_of(app, BOB) as bob:
        held = [asyncio.create_task(post(alice, SLOW, f"key-{i}")) for i in range(2)]
        await until(lambda: service.waiting == 2)

        refused = await post(alice, "print(1)")
        neighbour = await post(bob, "print(2)")
        not_waiting = await alice.post(
            "/v1/executions?wait=false", json={"language": "python", "code": "print(3)"}
        )

        assert refused.status_code == 429
        assert refused.json()["error"]["details"][0]["type"] == "max_open_waits"
        assert neighbour.status_code == 200
        assert not_waiting.status_code == 202
        service.release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert (await post(alice, "print(4)")).status_code == 200


async def test_streams_hold_a_wait_slot_until_they_end(service: HeldService) -> None:
    app = app_with(service, max_waits_per_execution=2)
    async with await client_of(app) as client:
        created = await client.post(
            "/v1/executions?wait=false", json={"language": "python", "code": SLOW}
        )
        url = f"/v1/executions/{created.json()['id']}/stream"
        streams = [asyncio.create_task(client.get(url)) for _ in range(2)]
        await until(lambda: service.waiting == 2)

        refused = await client.get(url)

        assert refused.status_code == 429
        assert refused.headers["content-type"].startswith("application/json")
        assert refused.json()["error"]["code"] == "too_many_waits"
        service.release.set()
        for response in await asyncio.gather(*streams):
            assert response.status_code == 200
            assert "event: exit" in response.text
    assert app.state.admission.open_waits("alice") == 0


async def test_log_follows_are_bounded_across_tenants(service: HeldService) -> None:
    app = app_with(service, {"max_log_follows": 1})
    async with await client_of(app) as alice, await client_of(app, BOB) as bob:
        mine = await alice.post(
            "/v1/executions?wait=false", json={"language": "python", "code": SLOW}
        )
        theirs = await bob.post(
            "/v1/executions?wait=false", json={"language": "python", "code": "x"}
        )
        stream = asyncio.create_task(alice.get(f"/v1/executions/{mine.json()['id']}/stream"))
        await until(lambda: service.waiting == 1)

        refused = await bob.get(f"/v1/executions/{theirs.json()['id']}/stream")

        assert refused.status_code == 429
        assert refused.json()["error"]["details"][0]["type"] == "max_log_follows"
        service.release.set()
        assert (await stream).status_code == 200


def unfinished(name: str, owner: str = "alice") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {TENANT_LABEL: owner}},
        "spec": {"language": "python", "source": "x", "timeoutSeconds": 10},
        "status": {"phase": "Running"},
    }


async def test_the_concurrency_count_reads_metadata_only(service: HeldService) -> None:
    app = app_with(service, max_concurrent=2)
    service.objects[("ns-alice", "cx-a")] = unfinished("cx-a")
    # Finished (labelled by the operator) and other tenants' executions do not count.
    finished = unfinished("cx-b")
    finished["metadata"]["labels"]["sandpod.dev/finished"] = "true"
    service.objects[("ns-alice", "cx-b")] = finished
    service.objects[("ns-alice", "cx-c")] = unfinished("cx-c", owner="bob")
    async with await client_of(app) as client:
        body = {"language": "python", "code": "print(1)"}
        first = await client.post("/v1/executions?wait=false", json=body)
        second = await client.post("/v1/executions?wait=false", json=body)

    assert first.status_code == 202
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "concurrency_limit"
    assert 1 <= int(second.headers["Retry-After"]) <= 60
    assert service.metadata_lists == 2


@pytest.mark.parametrize(("max_cpu", "expected"), [("250m", "250m"), ("2", "500m")])
async def test_a_tenants_max_cpu_holds_when_the_request_names_no_cpu(
    service: HeldService, max_cpu: str, expected: str
) -> None:
    app = app_with(service, max_cpu=max_cpu)
    async with await client_of(app) as client:
        assert (await post(client, "print(1)")).status_code == 200
    assert service.created[0]["spec"]["resources"]["cpu"] == expected


class UnreadyKeys:
    async def authenticate(self, key: str) -> Tenant | None:
        return None

    async def tenant(self, name: str) -> Tenant | None:
        return None

    async def check_ready(self) -> None:
        raise KeyStoreUnavailable("Secret sandpod-system/sandpod-api-keys does not exist")


class UnreadyCluster(FakeExecutionService):
    async def check_ready(self) -> None:
        raise KubernetesUnavailable(
            "discovering sandpod.dev/v1alpha1: 403 sandpod-gateway cannot list in sandpod-system"
        )


@pytest.mark.parametrize("broken", ["keys", "cluster"])
async def test_readyz_names_nothing_internal(broken: str) -> None:
    app = make_app(UnreadyCluster() if broken == "cluster" else FakeExecutionService(), {})
    if broken == "keys":
        app.dependency_overrides[get_key_store] = UnreadyKeys
    async with await client_of(app) as client:
        response = await client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "not_ready"
    for internal in ("sandpod-system", "sandpod-api-keys", "sandpod-gateway", "403", "Secret"):
        assert internal not in response.text
