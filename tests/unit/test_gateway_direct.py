"""Runs in a session, and waiting one-off runs, through the direct path
(sandpod_gateway/usecases/direct_runs.py), the operator's side played by a fake DirectRunner:
answered from it, recorded by it (not created by the gateway), the record path when it cannot
take the run, and a retry that runs nothing twice."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gateway_fakes import (
    FakeExecutionService,
    FakeSessionService,
    created_from,
    make_app,
    parse_sse,
    tenant,
)
from sandpod_contract.runner import OutputChunk
from sandpod_gateway.kube.service import SessionNotFound
from sandpod_gateway.usecases.direct_runs import NotServingNow
from sandpod_gateway.web.dependencies import get_direct_runner
from sandpod_gateway.web.errors import GatewayError

ALICE = "sk-alice-0123456789"


class FakeDirectRunner:
    """Plays the operator's direct path: each run's record (written into the execution
    service, as the operator writes it behind), or a refusal."""

    def __init__(self, service: FakeExecutionService) -> None:
        self.service = service
        self.runs: list[dict[str, Any]] = []
        self.refusal: Exception | None = None
        # Handed to a caller that listens, before the record.
        self.output: list[OutputChunk] = []

    async def run(
        self, namespace: str, execution: Any, timeout_seconds: int, on_output: Any = None
    ) -> Any:
        if self.refusal is not None:
            raise self.refusal
        self.runs.append(copy.deepcopy(execution))
        for chunk in self.output if on_output is not None else []:
            on_output(chunk)
            await asyncio.sleep(0)
        record = created_from(execution, namespace)
        record["status"] = {"phase": "Succeeded", "exitCode": 0, "stdout": "direct\n"}
        record["metadata"].setdefault("labels", {})["sandpod.dev/finished"] = "true"
        self.service.objects[(namespace, record["metadata"]["name"])] = copy.deepcopy(record)
        return record

    async def close(self) -> None:
        return None


@pytest.fixture
def direct(service: FakeExecutionService) -> FakeDirectRunner:
    return FakeDirectRunner(service)


@pytest.fixture
def app(
    tmp_path: Path,
    service: FakeExecutionService,
    direct: FakeDirectRunner,
    sessions: FakeSessionService,
) -> FastAPI:
    app = make_app(
        service,
        {ALICE: tenant("alice", max_sessions=2)},
        kubeconfig_dir=tmp_path,
        sessions=sessions,
    )
    app.dependency_overrides[get_direct_runner] = lambda: direct
    return app


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {ALICE}"})


@pytest.fixture
def session(client: TestClient) -> str:
    response = client.post("/v1/sessions", json={"language": "python"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def run(client: TestClient, session: str, **headers: str) -> Any:
    return client.post(f"/v1/sessions/{session}/executions", json={"code": "1"}, headers=headers)


def test_a_run_is_answered_by_the_direct_path_and_not_created_by_the_gateway(
    client: TestClient, session: str, service: FakeExecutionService, direct: FakeDirectRunner
) -> None:
    response = run(client, session)

    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["stdout"]) == ("success", "direct\n")
    assert service.created == []
    [sent] = direct.runs
    assert sent["spec"]["session"] == session
    assert sent["metadata"]["labels"]["sandpod.dev/tenant"] == "alice"


def test_a_streamed_run_sends_its_output_as_it_comes_then_its_result(
    client: TestClient, session: str, direct: FakeDirectRunner
) -> None:
    direct.output = [
        OutputChunk("stdout", "dir"),
        OutputChunk("stderr", "!"),
        OutputChunk("stdout", "ect\n"),
    ]

    response = client.post(f"/v1/sessions/{session}/executions/stream", json={"code": "1"})

    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    assert [name for name, _ in events] == ["stdout", "stderr", "stdout", "exit"]
    assert "".join(data["data"] for name, data in events if name == "stdout") == "direct\n"
    assert events[-1][1]["status"] == "success"


def test_a_streamed_run_that_wrote_nothing_live_replays_its_output(
    client: TestClient, session: str
) -> None:
    response = client.post(f"/v1/sessions/{session}/executions/stream", json={"code": "1"})

    events = parse_sse(response.text)
    assert [name for name, _ in events] == ["stdout", "exit"]
    assert events[0][1] == {"data": "direct\n"}


def test_a_refused_streamed_run_is_an_error_answer(
    client: TestClient, session: str, direct: FakeDirectRunner
) -> None:
    direct.refusal = GatewayError(429, "session_busy", "busy", headers={"Retry-After": "1"})

    response = client.post(f"/v1/sessions/{session}/executions/stream", json={"code": "1"})

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1"


def test_runs_after_the_first_read_nothing_before_the_direct_path(
    client: TestClient, session: str, sessions: FakeSessionService, direct: FakeDirectRunner
) -> None:
    reads = sessions.reads
    answers = [run(client, session) for _ in range(3)]

    assert [answer.status_code for answer in answers] == [200] * 3
    assert sessions.reads == reads + 1
    assert len(direct.runs) == 3


def test_a_session_the_operator_no_longer_has_is_read_again_next_time(
    client: TestClient, session: str, sessions: FakeSessionService, direct: FakeDirectRunner
) -> None:
    run(client, session)
    direct.refusal = SessionNotFound(session)
    gone = run(client, session)
    direct.refusal = None
    reads = sessions.reads
    again = run(client, session)

    assert (gone.status_code, again.status_code) == (404, 200)
    assert sessions.reads == reads + 1


def test_a_retry_with_the_same_key_gets_the_same_run(
    client: TestClient, session: str, direct: FakeDirectRunner
) -> None:
    first = run(client, session, **{"Idempotency-Key": "k-1"})
    again = run(client, session, **{"Idempotency-Key": "k-1"})

    assert (first.status_code, again.status_code) == (200, 200)
    assert first.json()["id"] == again.json()["id"]
    assert len(direct.runs) == 1


def test_a_session_the_direct_path_cannot_take_takes_the_record_path(
    client: TestClient, session: str, service: FakeExecutionService, direct: FakeDirectRunner
) -> None:
    direct.refusal = NotServingNow("the session is starting")

    response = run(client, session)

    assert response.status_code == 200, response.text
    assert [created["spec"]["session"] for created in service.created] == [session]


def test_a_busy_session_answers_429_with_retry_after(
    client: TestClient, session: str, direct: FakeDirectRunner
) -> None:
    direct.refusal = GatewayError(429, "session_busy", "16 runs", headers={"Retry-After": "1"})

    response = run(client, session)

    assert (response.status_code, response.headers["Retry-After"]) == (429, "1")
    assert response.json()["error"]["code"] == "session_busy"


def test_a_run_that_does_not_wait_takes_the_record_path(
    client: TestClient, session: str, service: FakeExecutionService, direct: FakeDirectRunner
) -> None:
    response = client.post(
        f"/v1/sessions/{session}/executions", params={"wait": "false"}, json={"code": "1"}
    )

    assert response.status_code in (200, 202), response.text
    assert direct.runs == []
    assert len(service.created) == 1


# --- one-off runs: a ready pool sandbox through the direct path, else the record path ----------


def test_a_waiting_one_off_run_tries_a_pool_sandbox_first(
    client: TestClient, service: FakeExecutionService, direct: FakeDirectRunner
) -> None:
    response = client.post("/v1/executions", json={"language": "python", "code": "1"})

    assert response.status_code == 200, response.text
    assert response.json()["stdout"] == "direct\n"
    assert service.created == []
    [sent] = direct.runs
    assert "session" not in sent["spec"]


def test_a_one_off_run_no_pool_sandbox_takes_is_created_for_the_record_path(
    client: TestClient, service: FakeExecutionService, direct: FakeDirectRunner
) -> None:
    direct.refusal = NotServingNow("no ready sandbox of a pool fits this run now")

    response = client.post("/v1/executions", json={"language": "python", "code": "1"})

    assert response.status_code == 200, response.text
    assert len(service.created) == 1


@pytest.mark.parametrize(
    ("params", "body"),
    [({"wait": "false"}, {}), ({}, {"mode": "lint"})],
    ids=["no-wait", "lint"],
)
def test_one_off_runs_that_do_not_wait_or_lint_skip_the_direct_path(
    client: TestClient,
    service: FakeExecutionService,
    direct: FakeDirectRunner,
    params: dict[str, str],
    body: dict[str, str],
) -> None:
    response = client.post(
        "/v1/executions", params=params, json={"language": "python", "code": "1", **body}
    )

    assert response.status_code in (200, 202), response.text
    assert direct.runs == []
    assert len(service.created) == 1
