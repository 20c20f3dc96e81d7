"""Headless Chromium for the browser tests: where it is, how it is started, how long a page may
take, and where screenshots of failures go."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.services import missing_service

TESTS = Path(__file__).resolve().parents[1]
ARTIFACTS = TESTS / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
UI_TIMEOUT_MS = 20_000


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright, closed after; a missing one fails under CI."""
    if shutil.which("chromium") is None and not os.path.exists(CHROMIUM):
        missing_service("chromium not found: run `make chromium` "
                        "(Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def checked_page(browser: Any) -> Iterator[Any]:
    """A page in a browser context of its own (empty localStorage), closed after; fails the
    test on any JavaScript error the page raised."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


@contextmanager
def dashboard_page(browser: Any, base: str, key: str, who: str) -> Iterator[Any]:
    """A checked page signed in to ``base``'s dashboard with ``key`` (named ``who``)."""
    with checked_page(browser) as page:
        page.goto(f"{base}/ui/#key={key}")
        page.wait_for_selector(f"#who >> text={who}")
        yield page
