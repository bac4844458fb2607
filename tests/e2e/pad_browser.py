"""Debian's Chromium, driven by Playwright, on the scratch pad the chart's gateway serves."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, expect

REPO_ROOT = Path(__file__).resolve().parents[2]
# Where the tests put their screenshots; docs/screenshots holds the ones the docs show.
SCREENSHOTS = Path(os.environ.get("PAD_SCREENSHOTS", REPO_ROOT / ".build" / "screenshots"))
LAPTOP = {"width": 1366, "height": 860}
PHONE = {"width": 390, "height": 844}
# A cold sandbox start plus the program.
RUN_MS = 120_000


class Pad:
    """The scratch pad in one browser page, as a person would use it."""

    def __init__(self, page: Page, gateway_url: str) -> None:
        self.page = page
        self.url = f"{gateway_url}/pad/"
        # Script errors and CSP refusals: a test fails on any. (Chromium logs every 4xx
        # answer too; those the tests provoke on purpose.)
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(message.text)

    def open(self, key: str | None = None) -> None:
        self.page.goto(self.url)
        if key is not None:
            self.enter_key(key)
            expect(self.page.locator("body")).to_have_attribute("data-state", "ready")

    def enter_key(self, key: str) -> None:
        expect(self.page.locator("#key-dialog")).to_be_visible()
        self.page.fill("#key-input", key)
        self.page.keyboard.press("Enter")

    def pick(self, language: str) -> None:
        self.page.select_option("#language", language)

    def write(self, code: str, *, typed: bool = False) -> None:
        """Replaces the editor's text: typed key by key, or inserted at once (no auto-indent)."""
        self.page.click(".cm-content")
        self.page.keyboard.press("ControlOrMeta+a")
        self.page.keyboard.press("Delete")
        if typed:
            self.page.keyboard.type(code)
        else:
            self.page.keyboard.insert_text(code)

    def code(self) -> str:
        return self.page.locator(".cm-content").inner_text()

    def run(self) -> None:
        self.page.click(".cm-content")
        self.page.keyboard.press("ControlOrMeta+Enter")

    def wait_done(self) -> str:
        """Waits for the run's end; its status line."""
        status = self.page.locator("#status")
        expect(status).to_have_attribute("data-state", "done", timeout=RUN_MS)
        return status.inner_text()

    def pane(self, stream: str) -> str:
        return self.page.locator(f"#{stream}").inner_text()

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path
