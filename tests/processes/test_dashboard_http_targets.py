"""An HTTP target job's page in real headless Chromium against the real `rsched api`,
`rsched dispatcher` and `rsched worker --http` sending to a real local HTTP server: the page
shows the target and each attempt's HTTP status and latency, as the HTTP API answers them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.api_process import running_api
from support.browser import dashboard_page
from support.http_receiver import Receiver, receiver  # noqa: F401 - the fixture
from support.processes import Proc, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_job_page_shows_the_target_and_each_attempts_status_and_latency(
        browser: Any, redis_url: str, receiver: Receiver, tmp_path: Path) -> None:  # noqa: F811
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
               RSCHED_HTTP_ALLOW=f"127.0.0.1:{receiver.port}")
    with running_api(redis_url, tmp_path) as api, api.http(api.admin) as http:
        procs = [Proc("dispatcher", ["dispatcher", "--max-sleep-ms", "200"], env, tmp_path),
                 Proc("worker", ["worker", "--http"], env, tmp_path)]
        try:
            url = f"{receiver.base}/status/503?fail=1"
            job = http.post("/jobs", json={"target": {"url": url}, "backoff":
                                           {"baseSeconds": 0.1}}).json()

            def succeeded() -> dict[str, Any] | None:
                runs = http.get(f"/jobs/{job['id']}/runs").json()["runs"]
                return next((r for r in runs if r["status"] == "succeeded"), None)

            ok = wait_for("the retry succeeds", succeeded, [api.proc, *procs])
            with dashboard_page(browser, api.base, api.admin, "http-admin") as page:
                page.goto(f"{api.base}/ui/#/jobs/{job['id']}")
                page.wait_for_selector("[data-test=target]")
                assert page.inner_text("[data-test=target]").strip() == f"POST {url}"
                page.wait_for_selector("[data-test=http-status]")
                shown = [t.strip() for t in
                         page.locator("[data-test=http-status]").all_inner_texts()]
                assert f"· HTTP 200 in {ok['result']['latencyMs']} ms" in shown
                assert "· HTTP 503" in shown
        finally:
            for p in procs:
                p.stop()
