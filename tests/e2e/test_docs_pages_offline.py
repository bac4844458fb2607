"""The chart's gateway serves /docs and /redoc by itself: Debian's Chromium renders both with
every request to another origin aborted, and every answer carries the security headers."""

from __future__ import annotations

import httpx
import pytest
from chart_release import DeployedGateway
from sandpod_testkit.browser import check_docs_render_offline, chromium


def test_docs_and_redoc_render_with_nothing_but_the_gateway(gateway: DeployedGateway) -> None:
    with chromium() as browser:
        check_docs_render_offline(browser, gateway.url)


@pytest.mark.parametrize(
    "path", ["/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js", "/openapi.json", "/healthz"]
)
def test_the_docs_and_the_api_answer_with_the_security_headers(
    gateway: DeployedGateway, path: str
) -> None:
    response = httpx.get(f"{gateway.url}{path}", timeout=30)

    assert response.status_code == 200
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
