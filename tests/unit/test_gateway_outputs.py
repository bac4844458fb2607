"""Output files through the gateway: inline up to the tenant's limit, GET .../files/{path},
and binary (base64) input files, with the Kubernetes side faked."""

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from gateway_fakes import FakeExecutionService, Run, make_app, tenant
from sandpod_gateway.web.security_headers import ATTACHMENT_HEADERS

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
CSV = b"a,b\n1,2\n"


def entry(path: str, content: bytes, media_type: str, key: str | None) -> dict[str, Any]:
    return {
        "path": path,
        "size": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "mediaType": media_type,
        "stored": key is not None,
        **({"key": key} if key else {}),
    }


def files_runner(spec: dict[str, Any]) -> Run:
    """Leaves a PNG, a CSV and a file too large to store, as the operator records them."""
    status = {
        "phase": "Succeeded",
        "exitCode": 0,
        "outputs": [
            entry("plot.png", PNG, "image/png", "file-0"),
            entry("data/t.csv", CSV, "text/csv", "file-1"),
            entry("huge.bin", b"x" * 10, "application/octet-stream", None),
        ],
        "outputsConfigMap": "run-0a1b2c3d-outputs",
        "outputsTruncated": True,
    }
    return Run(status, files={"file-0": PNG, "file-1": CSV})


@pytest.fixture
def service() -> FakeExecutionService:
    return FakeExecutionService(files_runner)


@pytest.fixture
def app(tmp_path: Path, service: FakeExecutionService) -> FastAPI:
    return make_app(
        service,
        {ALICE: tenant("alice", max_inline_file_bytes=len(PNG) + 4), BOB: tenant("bob")},
        kubeconfig_dir=tmp_path,
    )


def client_for(app: FastAPI, key: str = ALICE) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {key}"})


def run(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/executions", json={"language": "python", "code": "print(1)", **body})


def test_files_come_back_inline_up_to_the_tenants_limit(app: FastAPI) -> None:
    result = run(client_for(app)).json()

    files = {f["path"]: f for f in result["files"]}
    assert base64.b64decode(files["plot.png"]["content_base64"]) == PNG
    assert files["plot.png"]["media_type"] == "image/png"
    assert files["plot.png"]["sha256"] == hashlib.sha256(PNG).hexdigest()
    # The CSV no longer fits in what is left of the limit; huge.bin was never stored.
    assert files["data/t.csv"]["content_base64"] is None and files["data/t.csv"]["stored"]
    assert files["huge.bin"]["stored"] is False
    assert result["files_truncated"] is True
    fetched = client_for(app).get(f"/v1/executions/{result['id']}").json()
    assert fetched["files"] == result["files"]


def test_get_file_answers_the_bytes_with_the_media_type(app: FastAPI) -> None:
    client = client_for(app)
    execution = run(client).json()["id"]

    response = client.get(f"/v1/executions/{execution}/files/data/t.csv")

    assert response.status_code == 200
    assert response.content == CSV
    assert response.headers["content-type"].startswith("text/csv")
    assert response.headers["content-disposition"] == "attachment; filename*=UTF-8''t.csv"
    for name, value in ATTACHMENT_HEADERS.items():
        assert response.headers[name] == value


@pytest.mark.parametrize(
    ("path", "code"), [("nope.txt", "not_found"), ("huge.bin", "file_not_stored")]
)
def test_get_file_of_an_unknown_or_unstored_path_is_404(app: FastAPI, path: str, code: str) -> None:
    client = client_for(app)
    execution = run(client).json()["id"]

    response = client.get(f"/v1/executions/{execution}/files/{path}")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == code


def test_another_tenants_files_are_404(app: FastAPI, service: FakeExecutionService) -> None:
    execution = run(client_for(app)).json()["id"]
    reads = service.configmap_reads

    response = client_for(app, BOB).get(f"/v1/executions/{execution}/files/plot.png")

    assert response.status_code == 404
    assert service.configmap_reads == reads


def test_a_file_whose_stored_bytes_changed_is_not_served(
    app: FastAPI, service: FakeExecutionService
) -> None:
    client = client_for(app)
    execution = run(client).json()["id"]
    (key,) = service.configmaps
    service.configmaps[key]["file-1"] = b"tampered"

    assert client.get(f"/v1/executions/{execution}/files/data/t.csv").status_code == 404


def test_binary_input_files_become_base64_spec_files(
    app: FastAPI, service: FakeExecutionService
) -> None:
    blob = base64.b64encode(bytes([0, 1, 254, 255])).decode()
    files = [{"path": "in.bin", "content_base64": blob}, {"path": "t.txt", "content": "hi"}]

    assert run(client_for(app), files=files).status_code == 200

    assert service.created[-1]["spec"]["files"] == [
        {"path": "in.bin", "content": blob, "encoding": "base64"},
        {"path": "t.txt", "content": "hi"},
    ]


@pytest.mark.parametrize(
    "file",
    [
        {"path": "a.bin", "content_base64": "not base64!"},
        {"path": "a.bin"},
        {"path": "a.bin", "content": "x", "content_base64": "eA=="},
    ],
)
def test_an_input_file_needs_one_valid_content(app: FastAPI, file: dict[str, Any]) -> None:
    assert run(client_for(app), files=[file]).status_code == 422
