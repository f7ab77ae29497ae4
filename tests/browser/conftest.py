"""Real-browser tests: Debian's chromium driven by Playwright, against live_server."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.oidc import oidc_provider  # noqa: F401  (a real OIDC provider process)
from tests.support.processes import patience

# Playwright's sync API runs an event loop in this thread; the ORM calls here are still sync.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


@pytest.fixture(scope="session")
def browser():
    if CHROMIUM is None:
        pytest.fail("Debian's chromium is needed for the browser tests (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    # Every wait of a page gets the suite's generous bound (tests/support/processes.py).
    page.set_default_timeout(patience() * 1000)
    # The pages run under a strict Content-Security-Policy: any violation fails the test.
    violations = []
    page.on("console", lambda msg: violations.append(msg.text)
            if "Content Security Policy" in msg.text else None)
    yield page
    page.wait_for_load_state("networkidle")  # no request may race the database flush
    context.close()
    assert not violations, violations


@pytest.fixture
def shoot(page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def shoot(name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return shoot


def login(page, username: str) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "pw-" + username)
    page.click("button:has-text('Sign in')")
    page.wait_for_url("**/")
