"""/docs and /redoc work offline: headless Chromium renders both from a gateway on a local
port, with every request to another origin aborted (and the test failing on any)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_fakes import FakeExecutionService, make_app, served, tenant
from sandpod_testkit.browser import check_docs_render_offline, chromium


@pytest.fixture
def gateway_url(tmp_path: Path) -> Iterator[str]:
    """The gateway (its Kubernetes side faked) served by uvicorn in a thread."""
    app = make_app(FakeExecutionService(), {"sk-docs-0123456789": tenant("alice")}, tmp_path)
    with served(app) as url:
        yield url


def test_docs_and_redoc_render_with_nothing_but_the_gateway(gateway_url: str) -> None:
    with chromium() as browser:
        check_docs_render_offline(browser, gateway_url)
