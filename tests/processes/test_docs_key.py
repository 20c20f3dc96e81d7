"""/docs and /ui keep the API key under one name in real headless Chromium, so it is pasted once
(issue 15, item 10).  The app is served by uvicorn in this process, on the session redis-server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS
from support.live_api import LiveAPI
from support.redis_server import RedisServer
from support.services import missing_service

from rsched import Client
from rsched.core.settings import Settings
from rsched.service.apikeys import op_create_key

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def served(redis_server: RedisServer) -> Iterator[tuple[str, str]]:
    redis_server.resume()
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushall()
    s = Settings.from_env(redis_url=redis_server.url)
    c = Client(settings=s)
    _, secret = c.run(op_create_key("docs-reader", "read"))
    c.close()
    with LiveAPI(s) as api:
        yield f"http://127.0.0.1:{api.port}", secret


@pytest.fixture
def page() -> Iterator[Any]:
    if shutil.which("chromium") is None and not os.path.exists(CHROMIUM):
        missing_service("chromium not found: run `make chromium`")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            p = b.new_context().new_page()  # a fresh context: empty localStorage
            p.set_default_timeout(UI_TIMEOUT_MS)
            yield p
        finally:
            b.close()


def test_a_key_pasted_in_docs_signs_the_dashboard_in_and_back(
    served: tuple[str, str], page: Any
) -> None:
    base, secret = served
    page.goto(f"{base}/docs")
    page.fill("#key", secret)
    page.dispatch_event("#key", "change")
    page.goto(f"{base}/ui/")
    page.wait_for_selector("#who >> text=docs-reader")  # signed in, nothing pasted here
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-key-shared.png"))
    page.evaluate("localStorage.clear()")
    page.goto(f"{base}/docs")
    assert page.input_value("#key") == ""
    page.goto(f"{base}/ui/#key={secret}")  # signed in on the dashboard first...
    page.wait_for_selector("#who >> text=docs-reader")
    page.goto(f"{base}/docs")
    assert page.input_value("#key") == secret  # ...and /docs has it
