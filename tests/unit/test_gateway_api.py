"""The gateway's HTTP API, with the Kubernetes side replaced by in-memory fakes."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gateway_fakes import FakeExecutionService, make_app, parse_sse, tenant
from sandpod_contract.catalog import load_catalog
from sandpod_contract.names import CANCEL_ANNOTATION, TENANT_LABEL
from sandpod_gateway.kube.service import ExecutionNotFound, KubernetesUnavailable, PageData
from sandpod_gateway.web.dependencies import get_execution_service
from sandpod_testkit.expected import AGENT_TOOLS, CATALOG_LANGUAGES

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
CAROL = "sk-carol-0123456789"  # shares alice's namespace, not her executions


@pytest.fixture
def app(tmp_path: Path, service: FakeExecutionService) -> FastAPI:
    return make_app(
        service,
        {
            ALICE: tenant("alice", max_concurrent=2, max_timeout_seconds=30, max_memory="512Mi"),
            BOB: tenant("bob"),
            CAROL: tenant("carol", namespace="ns-alice"),
        },
        kubeconfig_dir=tmp_path,
        max_code_bytes=2000,
        max_request_bytes=8192,
    )


def client_for(app: FastAPI, key: str | None = ALICE) -> TestClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return TestClient(app, headers=headers)


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    return client_for(app)


def run(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/executions", json={"language": "python", "code": "print(1)", **body})


def error_of(response: Any) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


# --- authentication ---------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_a_missing_or_wrong_key_is_401(app: FastAPI, key: str | None) -> None:
    response = run(client_for(app, key))

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert error_of(response)["code"] == "unauthorized"


def test_a_non_bearer_authorization_is_401(app: FastAPI) -> None:
    response = TestClient(app).get("/v1/languages", headers={"Authorization": f"Basic {ALICE}"})

    assert response.status_code == 401


# --- create and wait --------------------------------------------------------------------


def test_run_waits_and_answers_the_result(
    client: TestClient, service: FakeExecutionService
) -> None:
    response = run(client, code="print(2 + 2)")

    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "success"
    assert result["stdout"] == "print(2 + 2)"
    assert result["stderr"] == ""
    assert result["exit_code"] == 0
    assert result["execution_time_ms"] == 5
    assert result["error_message"] is None
    assert result["language"] == "python"
    assert response.headers["Location"] == f"/v1/executions/{result['id']}"
    [created] = service.created
    assert created["metadata"]["namespace"] == "ns-alice"
    assert created["metadata"]["labels"][TENANT_LABEL] == "alice"
    assert created["spec"]["source"] == "print(2 + 2)"
    assert created["spec"]["timeoutSeconds"] == 10
    assert created["spec"]["resources"]["memory"] == "256Mi"


def test_run_passes_files_stdin_args_and_limits(
    client: TestClient, service: FakeExecutionService
) -> None:
    response = run(
        client,
        files=[{"path": "data/in.csv", "content": "a,b\n"}],
        stdin="x",
        args=["-v"],
        timeout_seconds=30,
        memory="512Mi",
        cpu="500m",
        max_output_bytes=4096,
        mode="lint",
    )

    assert response.status_code == 200
    spec = service.created[0]["spec"]
    assert spec["files"] == [{"path": "data/in.csv", "content": "a,b\n"}]
    assert (spec["stdin"], spec["args"], spec["mode"]) == ("x", ["-v"], "lint")
    assert spec["timeoutSeconds"] == 30
    assert spec["resources"] == {"memory": "512Mi", "cpu": "500m"}
    assert spec["maxOutputBytes"] == 4096


def test_a_failing_program_is_status_error_with_stderr(client: TestClient) -> None:
    result = run(client, code="fail()").json()

    assert result["status"] == "error"
    assert result["exit_code"] == 1
    assert result["stderr"] == "boom\n"
    assert result["error_message"] == "The program exited with code 1"


def test_wait_false_answers_202_at_once(client: TestClient, service: FakeExecutionService) -> None:
    response = client.post(
        "/v1/executions?wait=false", json={"language": "python", "code": "print(1)"}
    )

    assert response.status_code == 202
    assert response.json()["status"] == "pending"
    assert client.get(f"/v1/executions/{response.json()['id']}").json()["status"] == "pending"


def test_a_result_is_readable_later(client: TestClient) -> None:
    created = run(client).json()

    fetched = client.get(f"/v1/executions/{created['id']}")

    assert fetched.status_code == 200
    assert fetched.json() == created


# --- tenancy ----------------------------------------------------------------------------


def test_another_tenants_execution_is_404(app: FastAPI, client: TestClient) -> None:
    execution_id = run(client).json()["id"]

    for key in (BOB, CAROL):
        other = client_for(app, key)
        for response in (
            other.get(f"/v1/executions/{execution_id}"),
            other.delete(f"/v1/executions/{execution_id}"),
            other.get(f"/v1/executions/{execution_id}/stream"),
        ):
            assert response.status_code == 404
            assert error_of(response)["code"] == "not_found"
        assert other.get("/v1/executions").json()["items"] == []


@pytest.mark.parametrize("execution_id", ["nope", "UPPER", "a" * 64, "dots.in.name"])
def test_unknown_or_impossible_ids_are_404(client: TestClient, execution_id: str) -> None:
    assert client.get(f"/v1/executions/{execution_id}").status_code == 404


# --- listing ----------------------------------------------------------------------------


def test_list_is_paged(client: TestClient) -> None:
    ids = {run(client).json()["id"] for _ in range(3)}

    first = client.get("/v1/executions?limit=2").json()
    second = client.get(f"/v1/executions?limit=2&cursor={first['next_cursor']}").json()

    assert len(first["items"]) == 2
    assert second["next_cursor"] is None
    assert {item["id"] for item in first["items"] + second["items"]} == ids


def test_a_bad_cursor_is_400(client: TestClient) -> None:
    response = client.get("/v1/executions?cursor=garbage")

    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_cursor"


# --- cancel -----------------------------------------------------------------------------


def test_cancel_asks_the_operator_and_the_result_turns_cancelled(
    client: TestClient, service: FakeExecutionService
) -> None:
    execution_id = client.post(
        "/v1/executions?wait=false", json={"language": "python", "code": "print(1)"}
    ).json()["id"]

    response = client.delete(f"/v1/executions/{execution_id}")

    assert response.status_code == 202
    stored = service.objects[("ns-alice", execution_id)]
    assert stored["metadata"]["annotations"][CANCEL_ANNOTATION] == "true"
    result = client.get(f"/v1/executions/{execution_id}").json()
    assert result["status"] == "cancelled"
    assert result["error_message"] == "The execution was cancelled"


def test_cancelling_a_finished_execution_changes_nothing(client: TestClient) -> None:
    finished = run(client).json()

    response = client.delete(f"/v1/executions/{finished['id']}")

    assert response.status_code == 200
    assert response.json()["status"] == "success"


# --- stream -----------------------------------------------------------------------------


def test_stream_sends_output_chunks_then_exit(client: TestClient) -> None:
    execution_id = client.post(
        "/v1/executions?wait=false", json={"language": "python", "code": "print(3)"}
    ).json()["id"]

    response = client.get(f"/v1/executions/{execution_id}/stream")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[0] == ("stdout", {"data": "print(3)"})
    assert events[-1][0] == "exit"
    assert events[-1][1]["status"] == "success"
    assert events[-1][1]["id"] == execution_id


def test_stream_replays_the_status_output_once_the_pod_is_gone(
    client: TestClient, service: FakeExecutionService
) -> None:
    finished = run(client, code="fail()").json()
    service.pod_gone.add(finished["id"])

    events = parse_sse(client.get(f"/v1/executions/{finished['id']}/stream").text)

    assert [event for event, _ in events] == ["stderr", "exit"]
    assert events[0][1] == {"data": "boom\n"}
    assert events[1][1]["status"] == "error"


# --- idempotency ------------------------------------------------------------------------


def test_a_retried_create_returns_the_same_execution(
    app: FastAPI, client: TestClient, service: FakeExecutionService
) -> None:
    headers = {"Idempotency-Key": "req-42"}
    body = {"language": "python", "code": "print(1)"}

    first = client.post("/v1/executions", json=body, headers=headers)
    second = client.post("/v1/executions", json=body, headers=headers)
    bobs = client_for(app, BOB).post("/v1/executions", json=body, headers=headers)

    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert bobs.json()["id"] != first.json()["id"]
    assert len(service.created) == 2  # one for alice, one for bob


def test_an_idempotency_key_reused_for_another_request_is_409(client: TestClient) -> None:
    headers = {"Idempotency-Key": "req-43"}
    client.post("/v1/executions", json={"language": "python", "code": "1"}, headers=headers)

    response = client.post(
        "/v1/executions", json={"language": "python", "code": "2"}, headers=headers
    )

    assert response.status_code == 409
    assert error_of(response)["code"] == "idempotency_key_reused"


def test_a_retry_does_not_count_against_the_concurrency_limit(tmp_path: Path) -> None:
    service = FakeExecutionService(runner=None)
    app = make_app(service, {ALICE: tenant("alice", max_concurrent=1)})
    client = client_for(app)
    headers = {"Idempotency-Key": "req-44"}

    first = client.post(
        "/v1/executions?wait=false", json={"language": "bash", "code": "x"}, headers=headers
    )
    retry = client.post(
        "/v1/executions?wait=false", json={"language": "bash", "code": "x"}, headers=headers
    )

    assert first.status_code == retry.status_code == 202
    assert retry.json()["id"] == first.json()["id"]


# --- limits -----------------------------------------------------------------------------


def test_over_the_concurrency_limit_is_429_with_retry_after(tmp_path: Path) -> None:
    service = FakeExecutionService(runner=None)
    app = make_app(service, {ALICE: tenant("alice", max_concurrent=2)})
    client = client_for(app)
    body = {"language": "python", "code": "import time; time.sleep(60)"}
    for _ in range(2):
        assert client.post("/v1/executions?wait=false", json=body).status_code == 202

    response = client.post("/v1/executions?wait=false", json=body)

    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) >= 1
    error = error_of(response)
    assert error["code"] == "concurrency_limit"
    assert error["details"][0]["type"] == "max_concurrent"
    assert error["details"][0]["limit"] == 2
    assert len(service.created) == 2


def test_finished_executions_do_not_count_against_the_limit(client: TestClient) -> None:
    for _ in range(3):  # alice may run 2 at once; these finish one after the other
        assert run(client).status_code == 200


@pytest.mark.parametrize(
    ("body", "field", "kind", "limit"),
    [
        ({"timeout_seconds": 31}, "body.timeout_seconds", "max_timeout_seconds", 30),
        ({"memory": "1Gi"}, "body.memory", "max_memory", "512Mi"),
        ({"cpu": "2"}, "body.cpu", "max_cpu", "1"),
    ],
)
def test_over_a_tenant_limit_is_422_naming_it(
    client: TestClient, body: dict[str, Any], field: str, kind: str, limit: object
) -> None:
    response = run(client, **body)

    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "limit_exceeded"
    assert error["details"] == [
        {"field": field, "message": error["details"][0]["message"], "type": kind, "limit": limit}
    ]


def test_code_over_the_size_limit_is_413(client: TestClient, service: FakeExecutionService) -> None:
    response = run(client, code="x" * 2001)

    assert response.status_code == 413
    assert error_of(response)["code"] == "code_too_large"
    assert error_of(response)["details"][0]["limit"] == 2000
    assert service.created == []


def test_a_body_over_the_size_limit_is_413_before_parsing(client: TestClient) -> None:
    huge = b'{"language": "python", "code": "' + b"x" * 10000 + b'"}'

    declared = client.post(
        "/v1/executions", content=huge, headers={"Content-Type": "application/json"}
    )
    chunked = client.post(
        "/v1/executions",
        content=iter([huge[:5000], huge[5000:]]),
        headers={"Content-Type": "application/json"},
    )

    for response in (declared, chunked):
        assert response.status_code == 413
        assert error_of(response)["code"] == "payload_too_large"


# --- bad input --------------------------------------------------------------------------


def test_an_unknown_language_is_400_listing_the_known_ones(client: TestClient) -> None:
    response = run(client, language="cobol")

    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "unknown_language"
    assert "bash, csharp, go, javascript, python, typescript" in error["message"]


def test_lint_of_a_language_without_linter_is_400(client: TestClient) -> None:
    response = run(client, language="bash", mode="lint")

    assert response.status_code == 400
    assert error_of(response)["code"] == "lint_not_supported"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"language": "python"}, "body.code"),
        ({"language": "python", "code": ""}, "body.code"),
        ({"language": "python", "code": "1", "timeout_seconds": 0}, "body.timeout_seconds"),
        ({"language": "python", "code": "1", "memory": "lots"}, "body.memory"),
        ({"language": "python", "code": "1", "memory": "1Ti"}, "body.memory"),
        (
            {"language": "python", "code": "1", "files": [{"path": "../x", "content": ""}]},
            "body.files[0].path",
        ),
        ({"language": "python", "code": "1", "surprise": True}, "body.surprise"),
    ],
)
def test_bad_input_is_422_with_field_details(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/executions", json=body)

    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert field in [detail["field"] for detail in error["details"]]


def test_a_lone_surrogate_is_422_not_500(client: TestClient) -> None:
    response = client.post(
        "/v1/executions",
        content=b'{"language": "python", "code": "\\ud800"}',
        headers={"Content-Type": "application/json"},
    )

    assert response.status_code == 422
    assert error_of(response)["details"][0]["field"] == "body.code"


def test_malformed_json_is_422(client: TestClient) -> None:
    response = client.post(
        "/v1/executions", content=b"{not json", headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 422
    assert error_of(response)["details"][0]["type"] == "json_invalid"


def test_duplicate_file_paths_are_422_from_the_resource_model(client: TestClient) -> None:
    files = [{"path": "a.txt", "content": "1"}, {"path": "a.txt", "content": "2"}]

    response = run(client, files=files)

    assert response.status_code == 422
    assert error_of(response)["details"][0]["field"] == "body.files"


def test_a_bad_idempotency_key_is_422(client: TestClient) -> None:
    response = client.post(
        "/v1/executions",
        json={"language": "python", "code": "1"},
        headers={"Idempotency-Key": "has space"},
    )

    assert response.status_code == 422
    assert error_of(response)["details"][0]["field"] == "header.Idempotency-Key"


# --- failures of the cluster ------------------------------------------------------------


class BrokenService(FakeExecutionService):
    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        raise KubernetesUnavailable("connection refused")


class CrashingService(FakeExecutionService):
    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        raise RuntimeError("bug")


def test_an_unreachable_cluster_is_503_with_retry_after(app: FastAPI) -> None:
    app.dependency_overrides[get_execution_service] = BrokenService

    response = client_for(app).get("/v1/executions/cx-1")

    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert error_of(response)["code"] == "kubernetes_unavailable"


class VanishingService(FakeExecutionService):
    async def cancel(self, namespace: str, name: str) -> dict[str, Any]:
        raise ExecutionNotFound(name)

    async def list_metadata(
        self, namespace: str, *, label_selector: str, limit: int
    ) -> list[dict[str, Any]]:
        raise KubernetesUnavailable("connection refused")

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        raise KubernetesUnavailable("connection refused")


def test_not_found_and_unavailable_are_answered_wherever_they_arise(app: FastAPI) -> None:
    service = VanishingService()
    app.dependency_overrides[get_execution_service] = lambda: service
    client = client_for(app)
    created = client.post("/v1/executions?wait=false", json={"language": "python", "code": "x"})
    assert created.status_code == 503

    service.objects[("ns-alice", "cx-1")] = {
        "metadata": {"name": "cx-1", "labels": {TENANT_LABEL: "alice"}},
        "spec": {"language": "python"},
    }
    cancelled = client.delete("/v1/executions/cx-1")
    listed = client.get("/v1/executions")

    assert (cancelled.status_code, error_of(cancelled)["code"]) == (404, "not_found")
    assert (listed.status_code, error_of(listed)["code"]) == (503, "kubernetes_unavailable")
    assert listed.headers["Retry-After"] == "5"


def test_an_unexpected_failure_is_still_a_json_error(app: FastAPI) -> None:
    app.dependency_overrides[get_execution_service] = CrashingService
    client = TestClient(
        app, raise_server_exceptions=False, headers={"Authorization": f"Bearer {ALICE}"}
    )

    response = client.get("/v1/executions/cx-1")

    assert response.status_code == 500
    assert error_of(response)["code"] == "internal_error"


def test_unknown_paths_and_methods_are_json_errors(client: TestClient) -> None:
    assert error_of(client.get("/v2/nothing"))["code"] == "not_found"
    assert error_of(client.put("/v1/executions"))["code"] == "method_not_allowed"


# --- catalog and tools ------------------------------------------------------------------


def test_languages_come_from_the_catalog(client: TestClient) -> None:
    languages = {item["name"]: item for item in client.get("/v1/languages").json()["languages"]}

    assert sorted(languages) == CATALOG_LANGUAGES
    assert languages["python"]["lint"] is True
    assert languages["bash"]["lint"] is False
    assert languages["python"]["version"]


def test_languages_and_the_tools_show_the_catalogs_versions(client: TestClient) -> None:
    versions = {name: language.version for name, language in load_catalog().languages.items()}
    languages = client.get("/v1/languages").json()["languages"]
    [run_code, *_] = client.get("/v1/tools/openai").json()
    described = run_code["function"]["parameters"]["properties"]["language"]["description"]

    assert {item["name"]: item["version"] for item in languages} == versions
    for name, version in versions.items():
        assert f"{name} ({version})" in described


def test_the_openai_tools_are_run_code_and_the_session_tools(client: TestClient) -> None:
    tools = client.get("/v1/tools/openai").json()

    assert [tool["function"]["name"] for tool in tools] == AGENT_TOOLS
    tool = tools[0]
    assert tool["type"] == "function"
    function = tool["function"]
    assert function["name"] == "run_code"
    parameters = function["parameters"]
    assert parameters["required"] == ["language", "code"]
    assert parameters["properties"]["language"]["enum"] == CATALOG_LANGUAGES
    assert parameters["properties"]["timeout_seconds"]["maximum"] == 30


# --- operations -------------------------------------------------------------------------


def test_health_and_readiness(client: TestClient, service: FakeExecutionService) -> None:
    assert TestClient(client.app).get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}

    service.ready = False
    response = client.get("/readyz")

    assert response.status_code == 503
    assert error_of(response)["code"] == "not_ready"


def test_metrics_count_requests_latency_and_executions(client: TestClient) -> None:
    execution_id = run(client).json()["id"]
    client.get(f"/v1/executions/{execution_id}")

    text = client.get("/metrics").text

    assert (
        'sandpod_gateway_http_requests_total{method="GET",'
        'route="/v1/executions/{execution_id}",status="200"} 1.0'
    ) in text
    assert "sandpod_gateway_http_request_duration_seconds_bucket" in text
    assert 'sandpod_gateway_executions_total{language="python",status="success"} 1.0' in text


def test_openapi_documents_the_api(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()

    assert {"/v1/executions", "/v1/executions/{execution_id}", "/v1/languages"} <= set(
        schema["paths"]
    )
    assert client.get("/docs").status_code == 200


@pytest.fixture
def lifespan_client(app: FastAPI) -> Iterator[TestClient]:
    with client_for(app) as client:
        yield client


def test_the_app_starts_and_stops_with_its_lifespan(lifespan_client: TestClient) -> None:
    assert lifespan_client.get("/healthz").status_code == 200
