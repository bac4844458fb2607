"""/v1/sessions with the Kubernetes side replaced by in-memory fakes: open, limits,
idempotency, tenancy, close, runs in a session, streaming and files."""

import base64
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gateway_fakes import FakeExecutionService, FakeSessionService, Run, make_app, parse_sse, tenant
from sandpod_contract.names import SESSION_KIND, TENANT_LABEL
from sandpod_contract.runner import OutputChunk
from sandpod_gateway.web.security_headers import ATTACHMENT_HEADERS

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
CAROL = "sk-carol-0123456789"  # shares alice's namespace, not her sessions


class SessionFiles:
    """Plays a session's runner: uploads keep files, downloads print them base64-encoded,
    `x + 1` has a result, `boom` loses the state."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def __call__(self, spec: dict[str, Any]) -> Run:
        source = spec["source"]
        for file in spec.get("files", []):
            self.files[file["path"]] = file["content"]
        status: dict[str, Any] = {"phase": "Succeeded", "exitCode": 0, "stdout": ""}
        if "b64encode" in source:
            path = re.search(r'\)\)\("([^"]+)"\)', source)
            assert path is not None
            if path.group(1) not in self.files:
                return Run({"phase": "Failed", "exitCode": 3})
            content = self.files[path.group(1)].encode()
            status["stdout"] = base64.b64encode(content).decode() + "\n"
        elif source == "x + 1":
            status.update(result="42", reportedBy="sessionKernel")
        elif source == "boom":
            status = {"phase": "TimedOut", "stateLost": True, "message": "restarted"}
        return Run(status, [OutputChunk("stdout", status.get("stdout", ""))])


@pytest.fixture
def files() -> SessionFiles:
    return SessionFiles()


@pytest.fixture
def service(files: SessionFiles) -> FakeExecutionService:
    return FakeExecutionService(files)


@pytest.fixture
def app(tmp_path: Path, service: FakeExecutionService, sessions: FakeSessionService) -> FastAPI:
    return make_app(
        service,
        {
            ALICE: tenant(
                "alice",
                max_sessions=2,
                max_idle_timeout_seconds=300,
                max_lifetime_seconds=900,
                max_file_bytes=64,
                max_memory="512Mi",
            ),
            BOB: tenant("bob"),
            CAROL: tenant("carol", namespace="ns-alice"),
        },
        kubeconfig_dir=tmp_path,
        sessions=sessions,
    )


def client_for(app: FastAPI, key: str = ALICE) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    return client_for(app)


def open_session(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/sessions", json={"language": "python", **body})


def session_id(client: TestClient, **body: Any) -> str:
    response = open_session(client, **body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def error_code(response: Any) -> str:
    return str(response.json()["error"]["code"])


# --- open, limits, idempotency -------------------------------------------------------------


def test_a_session_opens_with_the_tenants_capped_defaults(
    client: TestClient, sessions: FakeSessionService
) -> None:
    response = open_session(client, memory="256Mi")

    assert response.status_code == 201
    body = response.json()
    assert response.headers["Location"] == f"/v1/sessions/{body['id']}"
    assert body["id"].startswith("cxs-")
    assert (body["status"], body["language"], body["memory"]) == ("ready", "python", "256Mi")
    assert (body["idle_timeout_seconds"], body["max_lifetime_seconds"]) == (300, 900)
    [stored] = sessions.objects.values()
    assert stored["kind"] == SESSION_KIND
    assert stored["metadata"]["labels"][TENANT_LABEL] == "alice"
    assert stored["spec"]["idleTimeoutSeconds"] == 300
    assert stored["spec"]["resources"] == {"memory": "256Mi", "cpu": "500m"}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"idle_timeout_seconds": 301}, 422, "limit_exceeded"),
        ({"max_lifetime_seconds": 901}, 422, "limit_exceeded"),
        ({"memory": "1Gi"}, 422, "limit_exceeded"),
        ({"idle_timeout_seconds": 5}, 422, "invalid_request"),
        ({"language": "cobol"}, 400, "unknown_language"),
        ({"network": {"egress": "allowlist"}}, 422, "invalid_request"),
    ],
)
def test_a_session_over_the_limits_is_refused(
    client: TestClient, body: dict[str, Any], status: int, code: str
) -> None:
    response = open_session(client, **body)

    assert (response.status_code, error_code(response)) == (status, code)


def test_ended_sessions_do_not_count_against_max_sessions(
    client: TestClient, sessions: FakeSessionService
) -> None:
    first = session_id(client)
    session_id(client)

    refused = open_session(client)
    sessions.end("ns-alice", first)

    assert (refused.status_code, error_code(refused)) == (429, "session_limit")
    assert refused.headers["Retry-After"]
    assert open_session(client).status_code == 201


def test_idempotency_key_returns_the_same_session(client: TestClient) -> None:
    headers = {"Idempotency-Key": "open-1"}
    first = client.post("/v1/sessions", json={"language": "python"}, headers=headers)
    again = client.post("/v1/sessions", json={"language": "python"}, headers=headers)
    other = client.post("/v1/sessions", json={"language": "bash"}, headers=headers)

    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert (other.status_code, error_code(other)) == (409, "idempotency_key_reused")


# --- get, list, close, tenancy -------------------------------------------------------------


def test_another_tenants_session_is_404(app: FastAPI, client: TestClient) -> None:
    sid = session_id(client)

    for key in (BOB, CAROL):
        other = client_for(app, key)
        for response in (
            other.get(f"/v1/sessions/{sid}"),
            other.delete(f"/v1/sessions/{sid}"),
            other.post(f"/v1/sessions/{sid}/executions", json={"code": "x"}),
            other.get(f"/v1/sessions/{sid}/files/a.txt"),
        ):
            assert (response.status_code, error_code(response)) == (404, "not_found")
        assert other.get("/v1/sessions").json()["items"] == []
    assert client.get(f"/v1/sessions/{sid}").json()["id"] == sid
    assert client.get("/v1/sessions/Not_A_Name").status_code == 404


def test_sessions_are_listed_in_pages(client: TestClient) -> None:
    ids = {session_id(client), session_id(client)}

    first = client.get("/v1/sessions", params={"limit": 1}).json()
    second = client.get("/v1/sessions", params={"limit": 1, "cursor": first["next_cursor"]})

    assert {first["items"][0]["id"], second.json()["items"][0]["id"]} == ids
    assert second.json()["next_cursor"] is None


def test_closing_deletes_the_session(client: TestClient, sessions: FakeSessionService) -> None:
    sid = session_id(client)
    ended = session_id(client)
    sessions.end("ns-alice", ended)

    closing = client.delete(f"/v1/sessions/{sid}")
    already = client.delete(f"/v1/sessions/{ended}")

    assert (closing.status_code, closing.json()["id"]) == (202, sid)
    assert client.get(f"/v1/sessions/{sid}").status_code == 404
    assert (already.status_code, already.json()["status"]) == (200, "ended")
    assert sessions.deleted == [("ns-alice", sid)]


# --- runs in a session ---------------------------------------------------------------------


def test_a_run_names_the_session_and_returns_its_result(
    client: TestClient, service: FakeExecutionService
) -> None:
    sid = session_id(client)

    first = client.post(f"/v1/sessions/{sid}/executions", json={"code": "x = 41"})
    second = client.post(
        f"/v1/sessions/{sid}/executions", json={"code": "x + 1", "language": "python"}
    )

    assert first.status_code == 200
    assert first.headers["Location"] == f"/v1/executions/{first.json()['id']}"
    body = second.json()
    assert (body["status"], body["session"], body["result"], body["state_lost"]) == (
        "success",
        sid,
        "42",
        False,
    )
    assert body["reported_by"] == "sessionKernel"
    for created in service.created:
        assert created["spec"]["session"] == sid
        assert created["spec"]["language"] == "python"
        assert created["spec"]["resources"] == {}


def test_a_command_runs_in_python_and_bash_sessions_and_is_refused_elsewhere(
    client: TestClient, service: FakeExecutionService
) -> None:
    command = {"command": "ls", "env": {"A": "b"}, "cwd": "sub"}
    python, node = session_id(client), session_id(client, language="javascript")
    in_python = client.post(f"/v1/sessions/{python}/commands", json=command)
    refused = client.post(f"/v1/sessions/{node}/commands", json=command)
    bad = client.post(f"/v1/sessions/{python}/commands", json={**command, "cwd": "../up"})
    client.delete(f"/v1/sessions/{node}")
    in_bash = client.post(
        f"/v1/sessions/{session_id(client, language='bash')}/commands", json=command
    )

    assert (in_python.status_code, in_bash.status_code) == (200, 200)
    [python_run, bash_run] = [created["spec"]["source"] for created in service.created]
    assert "subprocess.run" in python_run and "'/tmp/work/sub'" in python_run
    assert bash_run.startswith("cd /tmp/work/sub || exit 1\nexport A=b\nls")
    assert (refused.status_code, error_code(refused)) == (422, "commands_unsupported")
    assert bad.status_code == 422


def test_a_run_that_loses_the_state_says_so(client: TestClient) -> None:
    sid = session_id(client)

    body = client.post(f"/v1/sessions/{sid}/executions", json={"code": "boom"}).json()

    assert (body["status"], body["state_lost"]) == ("timeout", True)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"code": "x", "language": "bash"}, "language_mismatch"),
        ({"code": "x", "memory": "1Gi"}, "invalid_request"),
    ],
)
def test_a_run_cannot_change_the_sessions_sandbox(
    client: TestClient, body: dict[str, Any], code: str
) -> None:
    sid = session_id(client)

    response = client.post(f"/v1/sessions/{sid}/executions", json=body)

    assert (response.status_code, error_code(response)) == (422, code)


def test_a_lint_in_a_session_runs_beside_it_as_a_one_off_lint(
    client: TestClient, service: FakeExecutionService
) -> None:
    sid = session_id(client)

    response = client.post(
        f"/v1/sessions/{sid}/executions", json={"code": "import os", "mode": "lint"}
    )

    assert response.status_code == 200, response.text
    assert (response.json()["mode"], response.json()["session"]) == ("lint", None)
    spec = service.created[-1]["spec"]
    assert (spec["mode"], spec["language"], spec.get("session")) == ("lint", "python", None)


def test_a_lint_in_another_tenants_session_is_404(app: FastAPI, client: TestClient) -> None:
    sid = session_id(client)

    foreign = client_for(app, BOB).post(
        f"/v1/sessions/{sid}/executions", json={"code": "x", "mode": "lint"}
    )

    assert foreign.status_code == 404


def test_a_run_in_an_ended_session_is_409(
    client: TestClient, sessions: FakeSessionService, service: FakeExecutionService
) -> None:
    sid = session_id(client)
    sessions.end("ns-alice", sid)

    response = client.post(f"/v1/sessions/{sid}/executions", json={"code": "x"})

    assert (response.status_code, error_code(response)) == (409, "session_ended")
    assert service.created == []


def test_a_retried_run_with_its_key_is_the_same_execution(client: TestClient) -> None:
    sid = session_id(client)
    headers = {"Idempotency-Key": "run-1"}

    first = client.post(f"/v1/sessions/{sid}/executions", json={"code": "y"}, headers=headers)
    again = client.post(f"/v1/sessions/{sid}/executions", json={"code": "y"}, headers=headers)
    plain = client.post("/v1/executions", json={"language": "python", "code": "y"}, headers=headers)

    assert first.json()["id"] == again.json()["id"]
    assert (plain.status_code, error_code(plain)) == (409, "idempotency_key_reused")


def test_a_run_is_streamed_once_finished(client: TestClient) -> None:
    sid = session_id(client)
    execution = client.post(
        f"/v1/sessions/{sid}/executions", params={"wait": "false"}, json={"code": "x + 1"}
    ).json()

    response = client.get(f"/v1/sessions/{sid}/executions/{execution['id']}/stream")
    elsewhere = client.get(f"/v1/sessions/cxs-other/executions/{execution['id']}/stream")

    events = parse_sse(response.text)
    assert [event for event, _ in events] == ["exit"]
    assert events[-1][1]["result"] == "42"
    assert elsewhere.status_code == 404


# --- files ---------------------------------------------------------------------------------


def test_a_file_uploaded_downloads_the_same(
    client: TestClient, service: FakeExecutionService
) -> None:
    sid = session_id(client)

    uploaded = client.put(f"/v1/sessions/{sid}/files/data/in.csv", content=b"a,b\n1,2\n")
    downloaded = client.get(f"/v1/sessions/{sid}/files/data/in.csv")

    assert uploaded.status_code == 200
    assert uploaded.json()["size"] == 8
    assert downloaded.status_code == 200
    assert downloaded.content == b"a,b\n1,2\n"
    assert downloaded.headers["content-type"] == "application/octet-stream"
    # As an execution's output file: an attachment, never rendered on the gateway's origin.
    assert downloaded.headers["content-disposition"] == "attachment; filename*=UTF-8''in.csv"
    for name, value in ATTACHMENT_HEADERS.items():
        assert downloaded.headers[name] == value
    upload, download = service.created
    assert upload["spec"]["files"] == [{"path": "data/in.csv", "content": "a,b\n1,2\n"}]
    assert (upload["spec"]["session"], download["spec"]["session"]) == (sid, sid)


@pytest.mark.parametrize(
    ("path", "content", "status", "code"),
    [
        ("big.txt", b"x" * 65, 413, "file_too_large"),
        ("bin.dat", b"\xff\xfe", 415, "not_text"),
    ],
)
def test_uploads_are_bounded_text(
    client: TestClient, path: str, content: bytes, status: int, code: str
) -> None:
    sid = session_id(client)

    response = client.put(f"/v1/sessions/{sid}/files/{path}", content=content)

    assert (response.status_code, error_code(response)) == (status, code)


def test_a_missing_file_or_a_bad_path_is_refused(client: TestClient) -> None:
    sid = session_id(client)

    missing = client.get(f"/v1/sessions/{sid}/files/none.txt")
    hidden = client.get(f"/v1/sessions/{sid}/files/.secret")

    assert (missing.status_code, error_code(missing)) == (404, "file_not_found")
    assert hidden.status_code == 422


@pytest.mark.parametrize(
    ("name", "character"),
    [
        ("report\u202etxt.exe", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("pass\u200bword.txt", "U+200B ZERO WIDTH SPACE"),
        ("esc%1B[31mred.txt", "U+001B"),
    ],
)
def test_an_upload_whose_name_could_show_as_another_is_refused_naming_the_character(
    client: TestClient, service: FakeExecutionService, name: str, character: str
) -> None:
    sid = session_id(client)

    response = client.put(f"/v1/sessions/{sid}/files/data/{name}", content=b"x")

    assert (response.status_code, error_code(response)) == (422, "invalid_request")
    [detail] = response.json()["error"]["details"]
    assert (detail["field"], detail["type"]) == ("path.path", "file_name")
    assert detail["message"].startswith(f"{character} (")
    assert service.created == []


def test_a_run_whose_files_have_such_a_name_is_refused_naming_the_character(
    client: TestClient, service: FakeExecutionService
) -> None:
    sid = session_id(client)
    files = [{"path": "ok.txt", "content": ""}, {"path": "a\u2066b.txt", "content": ""}]

    response = client.post(f"/v1/sessions/{sid}/executions", json={"code": "1", "files": files})

    assert response.status_code == 422
    [detail] = response.json()["error"]["details"]
    assert detail["field"] == "body.files[1].path"
    assert detail["message"].startswith("U+2066 LEFT-TO-RIGHT ISOLATE (a bidirectional control")
    assert service.created == []
