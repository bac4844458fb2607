"""The scratch pad in a real browser (Debian's Chromium, headless, through Playwright) against
the session's gateway and operator on the cluster: what a person sees when they type a
program, run it, lint it, use a session, and get things wrong.

Screenshots of each state go to .build/screenshots (PAD_SCREENSHOTS to change it)."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

import httpx
import pytest
from chart_release import DeployedGateway
from pad_browser import LAPTOP, PHONE, RUN_MS, Pad
from playwright.sync_api import Browser, Response, expect
from sandpod_testkit.browser import chromium

STREAMING_PROGRAM = """\
import sys, time
print("first line", flush=True)
print("a warning", file=sys.stderr, flush=True)
time.sleep(4)
print("last line")
"""
# Two findings under the catalog's rules (ruff's ALL but a few): F401 and F821.
LINTED_PROGRAM = 'import os\n\n\ndef f() -> int:\n    """Return it."""\n    return undefined_name\n'
CHART_PROGRAM = """\
import matplotlib.pyplot as plt

plt.plot([1, 2, 3, 4], [1, 4, 9, 16], marker="o")
plt.title("squares")
plt.show()
"""


@pytest.fixture(scope="module")
def browser(gateway: DeployedGateway) -> Iterator[Browser]:
    served = httpx.get(f"{gateway.url}/pad/", timeout=30)
    if served.status_code != 200:
        pytest.fail(f"the gateway image serves no scratch pad: GET /pad/ {served.status_code}")
    with chromium() as browser:
        yield browser


@pytest.fixture
def key(gateway: DeployedGateway, namespace: str) -> str:
    return gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxConcurrent=2)


@pytest.fixture
def pad(browser: Browser, gateway: DeployedGateway) -> Iterator[Pad]:
    context = browser.new_context(viewport=LAPTOP)
    try:
        pad = Pad(context.new_page(), gateway.url)
        yield pad
        assert pad.errors == []
    finally:
        context.close()


def test_wrong_key_is_refused_in_plain_words(pad: Pad) -> None:
    pad.open()
    pad.enter_key("sk-not-a-key")
    error = pad.page.locator("#key-error")
    expect(error).to_contain_text("This API key is not accepted")
    pad.screenshot("wrong-key")
    assert pad.page.evaluate("localStorage.getItem('sandpod.apiKey')") is None


def test_output_arrives_while_the_program_runs(pad: Pad, key: str) -> None:
    pad.open(key)
    assert "sk-" not in pad.page.url  # the key never goes into a URL
    pad.pick("python")
    pad.write('print("typed", 6 * 7)\n', typed=True)
    pad.run()
    assert "Finished: exit code 0" in pad.wait_done()
    assert pad.pane("stdout").strip() == "typed 42"

    pad.write(STREAMING_PROGRAM)
    pad.run()
    stdout = pad.page.locator("#stdout")
    expect(stdout).to_contain_text("first line", timeout=RUN_MS)
    # The first line is on the page while the program still sleeps before its last one.
    expect(pad.page.locator("#status")).to_have_attribute("data-state", "running")
    assert "last line" not in pad.pane("stdout")
    expect(pad.page.locator("#stderr")).to_contain_text("a warning")
    pad.screenshot("running")
    status = pad.wait_done()
    assert "Finished: exit code 0" in status
    assert pad.pane("stdout") == "first line\nlast line\n"
    pad.screenshot("finished")
    pad.page.set_viewport_size(PHONE)
    pad.screenshot("phone")


def test_lint_marks_the_lines(pad: Pad, key: str) -> None:
    pad.open(key)
    pad.pick("python")
    pad.write(LINTED_PROGRAM)
    pad.page.click("#lint")
    expect(pad.page.locator("#status")).to_contain_text("2 problems", timeout=RUN_MS)
    expect(pad.page.locator(".cm-lint-marker-error")).to_have_count(2)
    expect(pad.page.locator(".cm-lintRange-error")).to_have_count(2)
    pad.page.hover(".cm-lintRange-error >> nth=1")
    expect(pad.page.locator(".cm-tooltip-lint")).to_contain_text("undefined_name")
    pad.screenshot("lint")


def test_timeout_and_busy_tenant_are_explained(
    pad: Pad, key: str, gateway: DeployedGateway
) -> None:
    pad.open(key)
    pad.pick("python")
    pad.page.click("#options summary")
    pad.page.fill("#timeout", "61")  # over this tenant's 60
    pad.write("import time\ntime.sleep(30)\n")
    pad.run()
    expect(pad.page.locator("#message")).to_contain_text("from 1 to 60")

    pad.page.fill("#timeout", "2")
    pad.run()
    assert "Timed out: stopped after 2 seconds" in pad.wait_done()
    pad.screenshot("timeout")

    with gateway.client(key) as http:  # this tenant runs 2 at once: fill both
        ids = [start_sleeper(http) for _ in range(2)]
        pad.run()
        expect(pad.page.locator("#message")).to_contain_text("Too many runs at once")
        expect(pad.page.locator("#message")).to_contain_text("Try again in")
        pad.screenshot("busy")
        for execution_id in ids:
            http.delete(f"/v1/executions/{execution_id}")


def start_sleeper(http: httpx.Client) -> str:
    response = http.post(
        "/v1/executions",
        params={"wait": "false"},
        json={"language": "python", "code": "import time\ntime.sleep(50)\n", "timeout_seconds": 60},
    )
    assert response.status_code == 202, response.text
    execution_id: str = response.json()["id"]
    return execution_id


def test_cancel_stops_the_run(pad: Pad, key: str) -> None:
    pad.open(key)
    pad.pick("python")
    pad.write('import time\nprint("started", flush=True)\ntime.sleep(50)\n')
    pad.run()
    expect(pad.page.locator("#stdout")).to_contain_text("started", timeout=RUN_MS)
    pad.page.click("#cancel")
    assert "Cancelled" in pad.wait_done()


def test_a_chart_is_shown(pad: Pad, key: str) -> None:
    pad.open(key)
    pad.pick("python")
    pad.write(CHART_PROGRAM)
    pad.run()
    assert "Finished: exit code 0" in pad.wait_done()
    image = pad.page.locator("#files img").first
    expect(image).to_be_visible()
    assert image.evaluate("img => img.decode().then(() => img.naturalWidth)") > 100
    expect(pad.page.locator("#file-list")).to_contain_text(".png")
    pad.screenshot("chart")


def test_a_session_keeps_variables(pad: Pad, key: str) -> None:
    pad.open(key)
    pad.pick("python")
    pad.page.check("#session-toggle")
    expect(pad.page.locator("#session-info")).to_contain_text("ends in", timeout=RUN_MS)
    pad.write("answer = 41\n")
    pad.run()
    assert "Finished" in pad.wait_done()
    pad.write("answer + 1\n")
    pad.run()
    assert "Finished" in pad.wait_done()
    expect(pad.page.locator("#value")).to_have_text("→ 42")
    pad.screenshot("session")
    pad.page.click("#session-end")
    expect(pad.page.locator("#session-info")).to_contain_text("ended")


def test_page_weight_and_time_to_interactive(
    browser: Browser, gateway: DeployedGateway, key: str, record_property: pytest.RecordProperty
) -> None:
    """Prints what the page costs: its JS and CSS gzipped, and the time from navigation to an
    editor ready to run (the key given, languages loaded). No bound on time (shared machine)."""
    context = browser.new_context(viewport=LAPTOP)
    context.add_init_script(f"localStorage.setItem('sandpod.apiKey', {key!r})")
    page = context.new_page()
    assets: dict[str, int] = {}

    def count(response: Response) -> None:
        if response.url.endswith((".js", ".css")):
            assets[response.url] = len(gzip.compress(response.body(), 9))

    page.on("response", count)
    started = time.monotonic()
    page.goto(f"{gateway.url}/pad/")
    expect(page.locator("body")).to_have_attribute("data-state", "ready")
    interactive_ms = (time.monotonic() - started) * 1000
    page.wait_for_load_state("networkidle")
    context.close()
    gzip_kib = sum(assets.values()) / 1024
    record_property("pad_gzip_kib", round(gzip_kib, 1))
    record_property("pad_time_to_interactive_ms", round(interactive_ms))
    print(
        f"scratch pad: {len(assets)} JS/CSS files, {gzip_kib:.1f} KiB gzipped; "
        f"interactive after {interactive_ms:.0f} ms"
    )
    assert gzip_kib < 400, assets
