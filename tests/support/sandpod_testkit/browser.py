"""Debian's Chromium, headless, driven by Playwright (no browser download): the scratch pad's
tests, and the gateway's API docs rendered with every origin but the gateway's cut off."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Locator,
    Page,
    Route,
    expect,
    sync_playwright,
)

CHROMIUM = Path(os.environ.get("PAD_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--metrics-recording-only",
    "--no-first-run",
]
# Time for a docs page to load its scripts and render the API (the bundles are ~1 MB each).
DOCS_RENDER_MS = 30_000
# How Chromium reports a load the page's Content-Security-Policy refused.
CSP_REFUSAL = re.compile(r"'(?P<url>[^']+)' violates the following Content Security Policy")


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium (`make test` and `make test-unit` install it); missing fails."""
    if not CHROMIUM.is_file():
        raise FileNotFoundError(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> str:
    """scheme://host:port, the port given even when the URL leaves it out (http://h/ and the
    http://h:80/ a browser may report for it are one origin)."""
    parts = urlsplit(url)
    port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    return f"{parts.scheme}://{parts.hostname}:{port}"


@dataclass
class OfflinePage:
    """A page that may reach only `base_url`'s origin: any other request is aborted and
    recorded in `left_origin`. What the page's own CSP refused to load from elsewhere never
    left either: `refused_elsewhere`. Script errors and other CSP refusals: `errors`."""

    page: Page
    base_url: str
    left_origin: list[str] = field(default_factory=list)
    refused_elsewhere: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.route("**/*", self._route)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", self._console)

    def _route(self, route: Route) -> None:
        if origin(route.request.url) == origin(self.base_url):
            route.continue_()
        else:
            self.left_origin.append(route.request.url)
            route.abort()

    def _console(self, message: ConsoleMessage) -> None:
        # Chromium logs each aborted request too: left_origin names those.
        if message.type != "error" or message.text.startswith("Failed to load resource"):
            return
        refusal = CSP_REFUSAL.search(message.text)
        if refusal and origin(refusal["url"]) != origin(self.base_url):
            self.refused_elsewhere.append(refusal["url"])
        else:
            self.errors.append(message.text)

    def open(self, path: str) -> None:
        response = self.page.goto(self.base_url + path)
        assert response is not None and response.status == 200, f"GET {path}: {response}"

    def expect_rendered(self, locator: Locator) -> None:
        """Waits for `locator` to show; failing, says what the page asked of other origins."""
        try:
            expect(locator).to_be_visible(timeout=DOCS_RENDER_MS)
        except AssertionError as error:
            raise AssertionError(
                f"{self.page.url} did not render: requests that left the origin "
                f"{self.left_origin}, errors {self.errors}"
            ) from error


def check_docs_render_offline(browser: Browser, base_url: str) -> None:
    """/docs shows Swagger UI's list of operations and /redoc ReDoc's, no request having
    left the gateway's origin, with no script error and nothing of the gateway's refused by
    the pages' CSP. (The CSP refuses ReDoc's attribution logo, from cdn.redoc.ly: ReDoc then
    leaves it out.)"""
    context = browser.new_context()
    try:
        swagger_ui = OfflinePage(context.new_page(), base_url)
        swagger_ui.open("/docs")
        operations = swagger_ui.page.locator(".opblock-summary-path")
        swagger_ui.expect_rendered(operations.filter(has_text="/v1/executions").first)
        assert operations.count() > 10, operations.all_inner_texts()

        redoc = OfflinePage(context.new_page(), base_url)
        redoc.open("/redoc")
        redoc.expect_rendered(redoc.page.get_by_role("heading", name="Get an execution").first)

        for docs in (swagger_ui, redoc):
            assert docs.left_origin == [], f"the docs asked for other origins: {docs.left_origin}"
            assert docs.errors == [], docs.errors
    finally:
        context.close()
