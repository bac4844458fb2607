"""The scratch pad's side of the gateway: the page as static files, and /v1/tenant that sizes
its inputs."""

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_fakes import FakeExecutionService, make_app, tenant
from sandpod_gateway.web.security_headers import PAD_HEADERS

KEY = "sk-pad-0123456789"


def client(pad_dir: Path, **limits: str | int) -> TestClient:
    app = make_app(FakeExecutionService(), {KEY: tenant("alice", **limits)}, pad_dir=pad_dir)
    return TestClient(app, headers={"Authorization": f"Bearer {KEY}"}, follow_redirects=False)


@pytest.fixture
def built_pad(tmp_path: Path) -> Path:
    (tmp_path / "index.html").write_text("<!doctype html><title>pad</title>")
    (tmp_path / "pad.js").write_text("console.log('pad')")
    return tmp_path


def test_the_page_is_served_with_its_security_headers(built_pad: Path) -> None:
    http = client(built_pad)

    page = http.get("/pad/")
    script = http.get("/pad/pad.js")

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>pad</title>" in page.text
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    for response in (page, script):
        for name, value in PAD_HEADERS.items():
            assert response.headers[name] == value
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]


def test_the_root_leads_to_the_page(built_pad: Path) -> None:
    response = client(built_pad).get("/")

    assert response.status_code == 307
    assert response.headers["location"] == "/pad/"


def test_an_unknown_asset_is_a_json_404(built_pad: Path) -> None:
    response = client(built_pad).get("/pad/nothing.js")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_pad_not_built_says_so(tmp_path: Path) -> None:
    response = client(tmp_path / "missing").get("/pad/")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "pad_not_built"


def test_tenant_answers_limits_and_defaults_within_them(tmp_path: Path) -> None:
    http = client(
        tmp_path,
        max_timeout_seconds=5,
        max_memory="128Mi",
        max_concurrent=3,
        requests_per_second=7,
        request_burst=9,
    )

    body = http.get("/v1/tenant").json()

    assert body == {
        "name": "alice",
        "limits": {
            "max_timeout_seconds": 5,
            "max_memory": "128Mi",
            "max_cpu": "1",
            "max_concurrent": 3,
            "max_open_waits": 20,
            "max_waits_per_execution": 4,
            "max_inline_file_bytes": 256 * 1024,
            "max_stored_bytes": 256 * 1024 * 1024,
            "max_sessions": 5,
            "max_idle_timeout_seconds": 1800,
            "max_lifetime_seconds": 7200,
            "max_file_bytes": 256 * 1024,
            "requests_per_second": 7,
            "request_burst": 9,
        },
        # the gateway's defaults (10 s, 256Mi, 500m), capped by the tenant's maximums
        "defaults": {"timeout_seconds": 5, "memory": "128Mi", "cpu": "500m"},
        "max_code_bytes": 256 * 1024,
        # no operator to count it (the gateway has no direct path here)
        "usage": None,
        "lint_rules": None,
    }


def test_tenant_needs_a_key(tmp_path: Path) -> None:
    response = client(tmp_path).get("/v1/tenant", headers={"Authorization": "Bearer sk-wrong"})

    assert response.status_code == 401
