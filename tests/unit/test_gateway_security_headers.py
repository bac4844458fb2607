"""Every answer of the gateway carries its security headers (nosniff, a CSP with
frame-ancestors 'none'), by what it is: API, scratch pad, API docs or a download; and the docs
pages name no other origin."""

import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_fakes import FakeExecutionService, http_client, make_app, tenant
from sandpod_gateway.web.security_headers import (
    API_HEADERS,
    DOCS_HEADERS,
    PAD_HEADERS,
    attachment_response,
    headers_for,
)

KEY = "sk-headers-0123456789"
MAX_REQUEST_BYTES = 4096


@pytest.fixture
def http(tmp_path: Path) -> TestClient:
    pad = tmp_path / "pad"
    pad.mkdir()
    (pad / "index.html").write_text("<!doctype html><title>pad</title>")
    app = make_app(
        FakeExecutionService(),
        {KEY: tenant("alice")},
        pad_dir=pad,
        max_request_bytes=MAX_REQUEST_BYTES,
    )
    return TestClient(app, headers={"Authorization": f"Bearer {KEY}"}, follow_redirects=False)


def assert_has(headers: Mapping[str, str], wanted: dict[str, str]) -> None:
    for name, value in wanted.items():
        assert headers.get(name) == value, name


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 200),
        ("GET", "/metrics", 200),
        ("GET", "/openapi.json", 200),
        ("GET", "/v1/languages", 200),
        ("GET", "/v1/executions/cx-none", 404),
        ("GET", "/nothing/here", 404),
        ("POST", "/v1/executions", 422),
        ("GET", "/", 307),
    ],
)
def test_api_answers_run_nothing_and_frame_nowhere(
    http: TestClient, method: str, path: str, status: int
) -> None:
    response = http.request(method, path, json={})

    assert response.status_code == status
    assert_has(response.headers, API_HEADERS)


def test_errors_before_any_route_carry_them_too(http: TestClient) -> None:
    unauthenticated = http.get("/v1/languages", headers={"Authorization": "Bearer sk-wrong"})
    too_large = http.post(
        "/v1/executions",
        content=b"x" * (MAX_REQUEST_BYTES + 1),
        headers={"Content-Type": "application/json"},
    )

    assert unauthenticated.status_code == 401
    assert too_large.status_code == 413
    for response in (unauthenticated, too_large):
        assert_has(response.headers, API_HEADERS)


async def test_the_mcp_endpoint_carries_them(tmp_path: Path) -> None:
    app = make_app(FakeExecutionService(), {KEY: tenant("alice")}, kubeconfig_dir=tmp_path)
    async with http_client(app, KEY) as client:
        response = await client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream"},
        )

    assert_has(response.headers, API_HEADERS)


@pytest.mark.parametrize("path", ["/pad/", "/pad/missing.js"])
def test_the_pad_has_its_own_policy(http: TestClient, path: str) -> None:
    assert_has(http.get(path).headers, PAD_HEADERS)


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("/docs", "text/html"),
        ("/redoc", "text/html"),
        ("/docs/swagger-ui-init.js", "text/javascript"),
        ("/docs/assets/swagger-ui-bundle.js", "text/javascript"),
        ("/docs/assets/swagger-ui.css", "text/css"),
        ("/docs/assets/redoc.standalone.js", "text/javascript"),
        ("/docs/assets/favicon.png", "image/png"),
    ],
)
def test_the_docs_and_their_assets_are_served_by_the_gateway(
    http: TestClient, path: str, media_type: str
) -> None:
    response = http.get(path)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media_type)
    assert_has(response.headers, DOCS_HEADERS)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_name_no_other_origin_and_run_no_inline_script(
    http: TestClient, page: str
) -> None:
    html = http.get(page).text
    init = http.get("/docs/swagger-ui-init.js").text

    for text in (html, init):
        assert "://" not in text
    referenced = re.findall(r'(?:src|href|spec-url)="([^"]*)"', html)
    assert referenced
    assert all(url.startswith("/") and not url.startswith("//") for url in referenced)
    for url in referenced:
        assert http.get(url).status_code == 200, url
    assert "<script>" not in html
    assert "script-src 'self';" in DOCS_HEADERS["Content-Security-Policy"]


def test_headers_follow_the_path_not_a_prefix_of_a_word() -> None:
    assert headers_for("/pad") == PAD_HEADERS
    assert headers_for("/paddle") == API_HEADERS
    assert headers_for("/docs/assets/x.js") == DOCS_HEADERS
    assert headers_for("/docsy") == API_HEADERS
    assert headers_for("/redoc") == DOCS_HEADERS


def test_an_attachment_is_sandboxed_and_named_after_the_last_part_of_its_path() -> None:
    response = attachment_response(b"<script>alert(1)</script>", "text/html", "out/a b\u00e9.html")

    assert response.headers["Content-Disposition"] == (
        "attachment; filename*=UTF-8''a%20b%C3%A9.html"
    )
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Security-Policy"].startswith("sandbox;")
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
