"""Sessions through the gateway, end to end: a uvicorn process against the cluster, with the
operator running (the session's `gateway` fixture, cluster_fixtures.py). They need the
operator's CodeSession controller and the runner's session mode (notes/sessions.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from chart_release import REQUEST_TIMEOUT, DeployedGateway
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


@pytest.fixture
def alice(gateway: DeployedGateway, namespace: str) -> Iterator[httpx.Client]:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxSessions=2)
    with gateway.client(key) as http:
        yield http


@pytest.fixture
def session(alice: httpx.Client) -> Iterator[str]:
    """An open Python session of alice's, closed afterwards."""
    response = alice.post("/v1/sessions", json={"language": "python"})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    yield session_id
    alice.delete(f"/v1/sessions/{session_id}")


def run_in(http: httpx.Client, session_id: str, code: str) -> dict[str, Any]:
    response = http.post(f"/v1/sessions/{session_id}/executions", json={"code": code})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_two_runs_share_a_variable(alice: httpx.Client, session: str) -> None:
    first = run_in(alice, session, "x = 41\nprint('set')")
    second = run_in(alice, session, "print(x + 1)\nx + 1")

    assert (first["status"], first["stdout"]) == ("success", "set\n")
    assert (second["status"], second["stdout"], second["result"]) == ("success", "42\n", "42")
    assert second["session"] == session
    assert second["state_lost"] is False
    assert second["reported_by"] == "sessionKernel"
    info = alice.get(f"/v1/sessions/{session}").json()
    assert info["execution_count"] == 2
    assert info["status"] == "ready"


def test_another_tenants_session_is_not_found(
    gateway: DeployedGateway, namespace: str, session: str
) -> None:
    key = gateway.add_tenant(f"{namespace[:50]}-mallory", namespace)

    with gateway.client(key) as mallory:
        answers = [
            mallory.get(f"/v1/sessions/{session}"),
            mallory.post(f"/v1/sessions/{session}/executions", json={"code": "print(1)"}),
            mallory.get(f"/v1/sessions/{session}/files/a.txt"),
            mallory.delete(f"/v1/sessions/{session}"),
        ]

    assert [answer.status_code for answer in answers] == [404] * 4
    assert {answer.json()["error"]["code"] for answer in answers} == {"not_found"}


def test_a_file_uploaded_downloads_the_same(alice: httpx.Client, session: str) -> None:
    content = "name,value\nanswer,42\n"

    uploaded = alice.put(f"/v1/sessions/{session}/files/data/in.csv", content=content.encode())
    read = run_in(alice, session, "open('data/in.csv').read().splitlines()[1]")
    downloaded = alice.get(f"/v1/sessions/{session}/files/data/in.csv")
    missing = alice.get(f"/v1/sessions/{session}/files/none.txt")

    assert uploaded.status_code == 200, uploaded.text
    assert read["result"] == "'answer,42'"
    assert downloaded.status_code == 200, downloaded.text
    assert downloaded.content == content.encode()
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "file_not_found")


async def test_an_mcp_client_opens_a_session_runs_twice_and_closes_it(
    gateway: DeployedGateway, namespace: str
) -> None:
    key = gateway.add_tenant(namespace, namespace)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=REQUEST_TIMEOUT)

    async with http, Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as mcp:
        opened = await mcp.call_tool("open_session", {"language": "python"})
        assert not opened.is_error, opened.content
        assert opened.structured_content is not None
        session_id = opened.structured_content["id"]
        first = await mcp.call_tool(
            "run_in_session", {"session_id": session_id, "code": "import math\nr = 2"}
        )
        second = await mcp.call_tool(
            "run_in_session", {"session_id": session_id, "code": "round(math.pi * r * r, 2)"}
        )
        closed = await mcp.call_tool("close_session", {"session_id": session_id})

    assert not first.is_error, first.content
    assert not second.is_error, second.content
    assert second.structured_content is not None
    assert second.structured_content["status"] == "success"
    assert second.structured_content["result"] == "12.57"
    assert not closed.is_error, closed.content
