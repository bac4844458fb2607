"""/docs and /redoc work offline: headless Chromium renders both from a gateway on a local
port, with every request to another origin aborted (and the test failing on any)."""

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from gateway_fakes import FakeExecutionService, make_app, tenant
from sandpod_testkit.browser import check_docs_render_offline, chromium
from sandpod_testkit.processes import free_port, http_ok
from sandpod_testkit.waiting import wait_until


@pytest.fixture
def gateway_url(tmp_path: Path) -> Iterator[str]:
    """The gateway (its Kubernetes side faked) served by uvicorn in a thread."""
    app = make_app(FakeExecutionService(), {"sk-docs-0123456789": tenant("alice")}, tmp_path)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/healthz"), timeout=30, what="the gateway's /healthz")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_docs_and_redoc_render_with_nothing_but_the_gateway(gateway_url: str) -> None:
    with chromium() as browser:
        check_docs_render_offline(browser, gateway_url)
