"""The dashboard's jobs page over the archive's job index, in real headless Chromium: the real
`rsched api` and `rsched archiver` processes with a SQLite archive; the search box and the sort
show what the HTTP API answers, in its order, and the page says how far the index is; without
an archive the page says it scans."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.browser import ARTIFACTS, checked_page, chromium
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched import Client
from rsched.core.settings import Settings

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]
LATER_MS = 1_893_456_000_000


def _stack(url: str, tmp: Path, archive: str | None) -> tuple[str, list[Proc]]:
    port = free_port()
    env = dict(os.environ, RSCHED_REDIS_URL=url, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env.pop("RSCHED_ARCHIVE_URL", None)
    procs = [Proc("api", ["api", "--port", str(port), "--no-auth"],
                  {**env, **({"RSCHED_ARCHIVE_URL": archive} if archive else {})}, tmp)]
    if archive:
        procs.append(Proc("archiver", ["archiver", "--poll-ms", "50"],
                          {**env, "RSCHED_ARCHIVE_URL": archive}, tmp))
    return f"http://127.0.0.1:{port}", procs


@pytest.fixture
def jobs(redis_server: RedisServer) -> Iterator[tuple[str, list[str]]]:
    """An emptied session server holding 30 jobs, some with idempotency keys."""
    redis_server.resume()
    if not redis_server.is_running():
        redis_server.start()
    c = Client(settings=Settings.from_env(redis_url=redis_server.url))
    c.r.flushall()
    ids = [c.schedule("tick" if i % 3 else "report", run_at=LATER_MS + (i * 7 % 30) * 60_000,
                      idempotency_key=f"invoice-{i:02d}" if i % 2 else None).id
           for i in range(30)]
    c.close()
    yield redis_server.url, ids


def _rows(page: Any) -> list[str]:
    return list(page.locator("tr[data-job]").evaluate_all("els => els.map(e => e.dataset.job)"))


def test_search_and_sort_show_the_index_in_the_apis_order(
    jobs: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, _ = jobs
    base, procs = _stack(url, tmp_path, f"sqlite:///{tmp_path}/archive.db")
    api = httpx.Client(base_url=base, timeout=10)
    try:
        def indexed_all() -> bool:
            if api.get("/readyz").status_code != 200:
                return False
            page = api.get("/jobs", params={"sort": "created", "limit": 100}).json()
            return len(page["jobs"]) == 30

        wait_for("the archiver indexed every job", indexed_all, procs)
        with chromium() as browser, checked_page(browser) as page:
            page.goto(f"{base}/ui/#/jobs")
            page.wait_for_selector("[data-test=index-notice] >> text=from the job index")
            want = [j["id"] for j in api.get("/jobs", params={"sort": "created", "limit": 100})
                    .json()["jobs"]]
            assert _rows(page) == want  # newest first, as the API lists them
            page.fill("input[name=q]", "invoice-1")
            page.press("input[name=q]", "Enter")
            found = api.get("/jobs", params={"q": "invoice-1", "limit": 100}).json()["jobs"]
            assert sorted(j["idempotencyKey"] for j in found) == [
                "invoice-11", "invoice-13", "invoice-15", "invoice-17", "invoice-19"]
            wait_for("the search's rows", lambda: _rows(page) == [j["id"] for j in found], procs)
            page.select_option("select[name=sort]", "nextRun")
            by_next = [j["id"] for j in api.get("/jobs", params={
                "q": "invoice-1", "sort": "nextRun", "limit": 100}).json()["jobs"]]
            assert by_next != [j["id"] for j in found]  # the order moves
            wait_for("the rows by next run", lambda: _rows(page) == by_next, procs)
            assert "q=invoice-1" in page.url and "sort=nextRun" in page.url
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "jobs-index-search.png"), full_page=True)
    finally:
        api.close()
        for p in procs:
            p.stop()


def test_without_an_archive_the_jobs_page_says_it_scans(
    jobs: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = jobs
    base, procs = _stack(url, tmp_path, None)
    try:
        wait_for("api ready", lambda: httpx.get(f"{base}/readyz").status_code == 200, procs)
        with chromium() as browser, checked_page(browser) as page:
            page.goto(f"{base}/ui/#/jobs?type=report")
            page.wait_for_selector("[data-test=index-notice] >> text=No run-history archive")
            assert sorted(_rows(page)) == sorted(ids[i] for i in range(0, 30, 3))
            assert page.locator("input[name=q]").is_disabled()
    finally:
        for p in procs:
            p.stop()
