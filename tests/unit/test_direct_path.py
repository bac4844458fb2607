"""The direct path's pure parts (operator/sandpod_operator/serving/direct.py) and its wire: the
gateway's client (sandpod_gateway/usecases/direct_runs.py) against the operator's real endpoint
(sandpod_operator/serving/endpoint.py) on a local port, with the runs behind it played."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import aiohttp
import pytest
from sandpod_contract.names import FINISHED_LABEL, RECORD_LABEL, TENANT_LABEL
from sandpod_contract.runner import OutputChunk
from sandpod_gateway.kube.service import SessionNotFound
from sandpod_gateway.usecases.direct_runs import DirectRunner, NotServingNow
from sandpod_gateway.web.errors import GatewayError
from sandpod_operator.serving import endpoint as direct_endpoint
from sandpod_operator.serving.core import InvalidRun, NotServing
from sandpod_operator.serving.direct import RecordEntry, build_record, each_at_most, records_due
from sandpod_operator.sessions.controller import SessionBusy, SessionController

NOW = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)
TOKEN = "t" * 48


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat()


def entry(
    name: str, created_ago: float, finished_ago: float | None, ttl: int | None = None
) -> RecordEntry:
    finished = "" if finished_ago is None else at(finished_ago)
    return RecordEntry(name, f"uid-{name}", at(created_ago), finished, ttl)


# --- records ---------------------------------------------------------------------------------


def test_a_record_is_the_gateways_execution_labelled_as_a_finished_record() -> None:
    execution = {
        "metadata": {
            "name": "x-1",
            "labels": {TENANT_LABEL: "alice"},
            "annotations": {"sandpod.dev/fingerprint": "abc"},
            "finalizers": ["someone/else"],
        },
        "spec": {"language": "python", "source": "print(1)", "session": "s"},
    }

    record = build_record(execution, "team")

    assert record["metadata"] == {
        "name": "x-1",
        "namespace": "team",
        "labels": {TENANT_LABEL: "alice", RECORD_LABEL: "direct", FINISHED_LABEL: "true"},
        "annotations": {"sandpod.dev/fingerprint": "abc"},
    }
    assert record["spec"] == execution["spec"]
    assert record["kind"] == "CodeExecution"


def test_records_without_a_status_are_lost_only_when_no_run_will_finish_them() -> None:
    entries = [
        entry("old", 300, None),
        entry("young", 10, None),
        entry("running", 300, None),
    ]

    due = records_due(entries, NOW, keep=10, lost_after=timedelta(seconds=120), running={"running"})

    assert [e.name for e in due.lost] == ["old"]
    assert due.expired == []


def test_records_go_after_their_ttl_and_the_oldest_beyond_the_bound() -> None:
    entries = [
        entry("a", 50, 40, ttl=3600),
        entry("b", 40, 30, ttl=3600),
        entry("c", 30, 20, ttl=10),
        entry("d", 20, 5, ttl=3600),
    ]

    due = records_due(entries, NOW, keep=3, lost_after=timedelta(seconds=120), running=set())

    assert sorted(e.name for e in due.expired) == ["a", "c"]


# --- a session's turns -----------------------------------------------------------------------


def controller() -> SessionController:
    """A controller for its turns alone (nothing else of it is used)."""
    unused: Any = None
    return SessionController(unused, unused, unused, unused, unused, unused)


async def test_a_sweeps_deletes_run_a_few_at_a_time_and_every_one_is_tried() -> None:
    in_flight, most, done = 0, 0, []

    async def delete(index: int) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        done.append(index)
        if index == 3:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        await each_at_most(4, [delete(index) for index in range(20)])
    assert (most, sorted(done)) == (4, list(range(20)))


async def test_runs_of_a_session_take_turns_in_arrival_order_and_a_full_queue_refuses() -> None:
    sessions = controller()
    order: list[int] = []
    release = asyncio.Event()

    async def run(number: int) -> None:
        async with sessions.turn("s", limit=3):
            order.append(number)
            await release.wait()

    tasks = [asyncio.create_task(run(number)) for number in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(SessionBusy):
        async with sessions.turn("s", limit=3):
            pass
    async with sessions.turn("another", limit=3):
        pass
    release.set()
    await asyncio.gather(*tasks)

    assert order == [0, 1, 2]
    assert dict(sessions.in_turn) == {}


# --- the wire: the gateway's client against the operator's endpoint ---------------------------


class PlayedRuns:
    """Answers runs as told: a record, or one of the refusals."""

    def __init__(self) -> None:
        self.refusal: Exception | None = None
        self.seen: list[tuple[str, str]] = []
        self.pooled: list[tuple[str, str, Any, Any]] = []
        # Written live by a run in a session, which then ends once `ended` is set.
        self.output: list[OutputChunk] = []
        self.ended = asyncio.Event()
        self.cancelled: list[tuple[str, str]] = []

    async def run(self, namespace: str, execution: Any, session: Any, on_output: Any = None) -> Any:
        self.seen.append((namespace, execution["metadata"]["name"]))
        if self.refusal is not None:
            raise self.refusal
        if self.output and on_output is not None:
            for chunk in self.output:
                on_output(chunk)
            await self.ended.wait()
        status = {"phase": "Succeeded", "stdout": "1\n"}
        return {**build_record(execution, namespace), "status": status}

    async def cancel(self, namespace: str, name: str) -> bool:
        self.cancelled.append((namespace, name))
        return name == "x-1"

    async def run_from_pool(
        self, namespace: str, execution: Any, pools: Any, pods: Any, on_output: Any = None
    ) -> Any:
        self.pooled.append((namespace, execution["metadata"]["name"], pools, pods))
        if self.refusal is not None:
            raise self.refusal
        status = {"phase": "Succeeded", "stdout": "pooled\n", "startMode": "warm"}
        return {**build_record(execution, namespace), "status": status}


@pytest.fixture
def runs() -> PlayedRuns:
    return PlayedRuns()


@asynccontextmanager
async def serving(runs: PlayedRuns, port: int) -> AsyncIterator[str]:
    """The operator's endpoint on a local port (in the test's own event loop)."""

    def session(namespace: str, name: str) -> Any:
        return {"metadata": {"name": name}} if name == "live" else None

    def pools(namespace: str) -> Any:
        return [{"pool": namespace}], [{"pod": namespace}]

    app = direct_endpoint.create_app(
        runs, TOKEN, session, pools, starting_wait_seconds=1, unseen_wait_seconds=0.2
    )
    runner = await direct_endpoint.start(app, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def client_and_intruder(
    runs: PlayedRuns, port: int
) -> AsyncIterator[tuple[DirectRunner, DirectRunner]]:
    """The gateway's client of the endpoint, and one with a wrong token."""
    async with serving(runs, port) as endpoint:
        client, intruder = direct_runner(endpoint), direct_runner(endpoint, "x" * 48)
        try:
            yield client, intruder
        finally:
            await client.close()
            await intruder.close()


def direct_runner(url: str, token: str = TOKEN) -> DirectRunner:
    return DirectRunner(partial(fixed, url), token, retry_after_seconds=5)


async def fixed(url: str) -> str:
    return url


def execution(session: str = "live") -> dict[str, Any]:
    return {"metadata": {"name": "x-1"}, "spec": {"session": session, "source": "print(1)"}}


async def test_a_run_comes_back_as_its_record(runs: PlayedRuns, unused_tcp_port: int) -> None:
    async with serving(runs, unused_tcp_port) as endpoint:
        client = direct_runner(endpoint)
        try:
            record = await client.run("team", execution(), timeout_seconds=10)
        finally:
            await client.close()

    assert record["status"] == {"phase": "Succeeded", "stdout": "1\n"}
    assert record["metadata"]["labels"][RECORD_LABEL] == "direct"
    assert runs.seen == [("team", "x-1")]


async def test_output_comes_live_then_the_record(runs: PlayedRuns, unused_tcp_port: int) -> None:
    runs.output = [OutputChunk("stdout", "first\n"), OutputChunk("stderr", "a warning\n")]
    seen: list[OutputChunk] = []

    def on_output(chunk: OutputChunk) -> None:
        seen.append(chunk)
        if len(seen) == len(runs.output):  # the run ends only once its output has come
            runs.ended.set()

    async with serving(runs, unused_tcp_port) as endpoint:
        client = direct_runner(endpoint)
        try:
            running = client.run("team", execution(), timeout_seconds=10, on_output=on_output)
            record = await asyncio.wait_for(running, 30)
        finally:
            await client.close()

    assert seen == runs.output
    assert record["status"] == {"phase": "Succeeded", "stdout": "1\n"}


async def test_a_run_that_writes_nothing_is_answered_whole(
    runs: PlayedRuns, unused_tcp_port: int
) -> None:
    seen: list[OutputChunk] = []
    async with serving(runs, unused_tcp_port) as endpoint:
        client = direct_runner(endpoint)
        try:
            record = await client.run(
                "team", execution(), timeout_seconds=10, on_output=seen.append
            )
        finally:
            await client.close()

    assert seen == []
    assert record["status"]["stdout"] == "1\n"


async def test_a_run_in_progress_is_cancelled_by_name(
    runs: PlayedRuns, unused_tcp_port: int
) -> None:
    async with client_and_intruder(runs, unused_tcp_port) as (client, intruder):
        assert await client.cancel("team", "x-1")
        assert not await client.cancel("team", "x-2")
        with pytest.raises(GatewayError):
            await intruder.cancel("team", "x-1")

    assert runs.cancelled == [("team", "x-1"), ("team", "x-2")]


async def test_a_one_off_run_goes_to_the_pool_route_with_the_namespaces_pools(
    runs: PlayedRuns, unused_tcp_port: int
) -> None:
    one_off = {"metadata": {"name": "x-2"}, "spec": {"source": "print(1)"}}
    async with serving(runs, unused_tcp_port) as endpoint:
        client = direct_runner(endpoint)
        try:
            record = await client.run("team", one_off, timeout_seconds=10)
            runs.refusal = NotServing("no ready sandbox of a pool fits this run now")
            with pytest.raises(NotServingNow):
                await client.run("team", one_off, timeout_seconds=10)
        finally:
            await client.close()

    assert record["status"]["stdout"] == "pooled\n"
    assert runs.pooled[0] == ("team", "x-2", [{"pool": "team"}], [{"pod": "team"}])
    assert runs.seen == []


@pytest.mark.parametrize(
    ("refusal", "expected"),
    [
        (NotServing("the session is starting"), NotServingNow),
        (InvalidRun("language go, not python"), 422),
        (SessionBusy(16), 429),
    ],
    ids=["not-serving", "invalid", "busy"],
)
async def test_refusals_become_the_gateways_answers(
    runs: PlayedRuns, unused_tcp_port: int, refusal: Exception, expected: Any
) -> None:
    runs.refusal = refusal
    async with serving(runs, unused_tcp_port) as endpoint:
        client = direct_runner(endpoint)
        try:
            with pytest.raises((NotServingNow, GatewayError)) as raised:
                await client.run("team", execution(), timeout_seconds=10)
        finally:
            await client.close()

    if expected is NotServingNow:
        assert isinstance(raised.value, NotServingNow)
    else:
        assert isinstance(raised.value, GatewayError)
        assert raised.value.status_code == expected
    if expected == 429:
        assert isinstance(raised.value, GatewayError)
        assert raised.value.headers == {"Retry-After": "1"}


async def test_an_unknown_session_and_a_wrong_token_run_nothing(
    runs: PlayedRuns, unused_tcp_port: int
) -> None:
    async with client_and_intruder(runs, unused_tcp_port) as (client, intruder):
        with pytest.raises(SessionNotFound):
            await client.run("team", execution("gone"), timeout_seconds=10)
        with pytest.raises(GatewayError) as refused:
            await intruder.run("team", execution(), timeout_seconds=10)

    assert refused.value.status_code == 503
    assert runs.seen == []


async def test_an_operator_not_listening_sends_the_run_the_record_way(
    unused_tcp_port: int,
) -> None:
    client = direct_runner(f"http://127.0.0.1:{unused_tcp_port}")
    try:
        with pytest.raises(NotServingNow):
            await client.run("team", execution(), timeout_seconds=10)
    finally:
        await client.close()


async def test_the_endpoint_refuses_a_malformed_body(
    runs: PlayedRuns, unused_tcp_port: int
) -> None:
    body = {"namespace": "team", "execution": {"metadata": {}}}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with serving(runs, unused_tcp_port) as endpoint, aiohttp.ClientSession() as http:
        response = await http.post(f"{endpoint}/v1/session-runs", json=body, headers=headers)
        status = response.status
        response.release()

    assert (status, runs.seen) == (400, [])


async def test_a_run_waits_for_a_starting_session_to_be_ready() -> None:
    phases = iter(["Starting", "Starting", "Ready"])

    def session(namespace: str, name: str) -> Any:
        return {"metadata": {"name": name}, "status": {"phase": next(phases)}}

    found = await direct_endpoint.once_started(session, "team", "s", wait_seconds=30)

    assert found is not None and found["status"]["phase"] == "Ready"


async def test_a_session_the_operator_has_not_seen_yet_is_waited_for() -> None:
    """The gateway read it from the API; the operator's watch brings it a moment later."""
    seen = iter([None, None, {"metadata": {"name": "s"}, "status": {"phase": "Ready"}}])

    found = await direct_endpoint.once_started(
        lambda namespace, name: next(seen), "team", "s", wait_seconds=30
    )

    assert found is not None and found["status"]["phase"] == "Ready"
