"""The dashboard in real headless Chromium (Debian's `chromium`, driven by Playwright), against
the real `rsched api`, `rsched dispatcher` and `rsched worker` processes: what a page shows is
checked against what the HTTP API answers.  Screenshots go to tests/artifacts/."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.browser import ARTIFACTS, UI_TIMEOUT_MS, dashboard_page
from support.helpers import all_jobs
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched import Client, JobSpec
from rsched.core.settings import Settings
from rsched.service.apikeys import op_create_key

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]


@dataclass
class Stack:
    base: str
    admin: str  # API key secrets
    read: str
    api: httpx.Client  # with the admin key
    client: Client
    procs: list[Proc]
    gate: Path

    def wait(self, what: str, check: Any, timeout_s: float = 30) -> Any:
        return wait_for(what, check, self.procs, timeout_s)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API, a dispatcher and a worker running the test app, on an emptied session server."""
    redis_server.resume()
    if not redis_server.is_running():
        redis_server.start()
    admin_client = Client(settings=Settings.from_env(redis_url=redis_server.url))
    admin_client.r.flushall()
    _, admin = admin_client.run(op_create_key("dashboard-admin", "admin"))
    _, read = admin_client.run(op_create_key("dashboard-viewer", "read"))
    tmp = tmp_path_factory.mktemp("dashboard")
    port = free_port()
    # The API samples the overview's history every second (a minute in production).
    env = dict(os.environ, RSCHED_REDIS_URL=redis_server.url, PYTHONUNBUFFERED="1",
               RSCHED_STATS_SAMPLE_MS="1000",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    procs = [
        Proc("api", ["api", "--port", str(port)], env, tmp),
        Proc("dispatcher", ["dispatcher", "--max-sleep-ms", "200"], env, tmp),
        Proc("worker", ["worker", "--app", "support.dashboard_app:app", "--heartbeat-ms", "500"],
             env, tmp),
    ]
    base = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {admin}"})
    s = Stack(base, admin, read, api, admin_client, procs, tmp / "gate")
    try:
        s.wait("api ready", lambda: api.get("/readyz").status_code == 200)
        yield s
    finally:
        api.close()
        for p in procs:
            p.stop()
        admin_client.close()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    """A fresh browser context (empty localStorage) signed in with the admin key."""
    with dashboard_page(browser, stack.base, stack.admin, "dashboard-admin") as p:
        yield p


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@contextmanager
def signed_in(browser: Any, base: str, key: str, route: tuple[str, Any] | None = None,
              clock_s: float | None = None) -> Iterator[Any]:
    """A page of a browser context of its own, opened at ``base``'s dashboard with ``key``;
    ``route`` (a URL pattern and its handler) is in place before the first request, and
    ``clock_s`` (epoch seconds) sets the browser's clock, which then runs on."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        p = context.new_page()
        p.set_default_timeout(UI_TIMEOUT_MS)
        if route:
            p.route(*route)
        if clock_s is not None:
            p.clock.install(time=clock_s)
        p.goto(f"{base}/ui/#key={key}")
        yield p
    finally:
        context.close()


def text(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.inner_text()).strip()


def test_the_overview_shows_what_the_status_route_says_and_charts_live_runs(
    page: Any, stack: Stack
) -> None:
    stack.client.schedule_many([JobSpec(type="tick", payload={"n": i}) for i in range(30)])
    stack.client.schedule("tick", cron="* * * * * *", idempotency_key="overview-every-second")
    st = stack.wait("the worker's heartbeat", lambda: (s := stack.api.get("/status").json())
                    ["workers"] and s)
    parts = len(st["partitions"])
    page.wait_for_selector(f"[data-test=partitions-owned] >> text='{parts} / {parts}'")
    page.wait_for_selector("[data-test=workers] >> text='1'")
    # Every partition row names the owner the API reports.
    st = stack.api.get("/status").json()
    for p in st["partitions"]:
        assert text(page, f"tr[data-partition='{p['partition']}'] td:nth-child(2)") == p["owner"]
    worker = st["workers"][0]["id"]
    assert page.locator(f"tr[data-worker='{worker}']").count() == 1
    assert text(page, "[data-test=dead-letters]") == str(st["deadLetters"])
    # Throughput and start lag come from /metrics (worker heartbeats): wait for numbers.
    for series in ("started", "succeeded", "p50", "p99"):
        page.wait_for_function(
            "s => { const b = document.querySelector(`[data-series=${s}]`);"
            " return b && b.textContent !== '—'; }", arg=series, timeout=30_000)
    page.wait_for_function("() => Number(document.querySelector('#chart-throughput')"
                           ".dataset.points) >= 5", timeout=30_000)
    started = float(text(page, "[data-series=started]").removesuffix("/s"))
    assert 0.2 < started < 100  # the every-second cron, plus the 30 one-off jobs early on
    # Redis's memory, projected as GET /memory (and rsched doctor) has it.
    page.wait_for_selector("tr[data-memory='total']")
    named = [m["part"] for m in stack.api.get("/memory").json()["parts"]]
    assert [page.get_attribute(f"[data-test=memory] tr[data-memory='{m}']", "data-memory")
            for m in named] == named == ["scheduled", "finished", "events", "dead letters", "total"]
    assert float(text(page, "tr[data-memory='total'] td:nth-child(2)")) > 0
    shot(page, "overview")


def test_a_job_page_shows_the_runs_the_api_has_and_pausing_it_pauses_the_job(
    page: Any, stack: Stack
) -> None:
    job = stack.client.schedule("tick", payload={"page": "job"}, cron="*/2 * * * * *",
                                tz="Europe/Berlin")
    stack.wait("two runs", lambda: len(stack.api.get(f"/jobs/{job.id}/runs").json()["runs"]) >= 2)
    page.goto(f"{stack.base}/ui/#/jobs?type=tick")
    page.wait_for_selector(f"tr[data-job='{job.id}']")
    shot(page, "jobs")
    page.click(f"tr[data-job='{job.id}'] a")
    page.wait_for_selector("h1 [data-status=scheduled]")
    assert job.id in text(page, "h1")
    page.wait_for_selector("ol.preview li")  # next runs from /schedules/preview, Berlin time
    assert page.locator("ol.preview li").count() == 5
    assert "+01:00" in text(page, "ol.preview li") or "+02:00" in text(page, "ol.preview li")
    page.get_by_role("button", name="Pause").click()
    page.wait_for_selector("h1 [data-status=paused]")
    assert stack.api.get(f"/jobs/{job.id}").json()["status"] == "paused"
    assert page.get_by_role("button", name="Resume").count() == 1
    assert page.get_by_role("button", name="Pause").count() == 0
    # Paused: no new occurrence starts, so the timeline settles; it lists the API's runs.
    time.sleep(1.5)
    api_runs = stack.api.get(f"/jobs/{job.id}/runs", params={"limit": 100}).json()["runs"]
    page.reload()
    page.wait_for_selector("h1 [data-status=paused]")
    page.wait_for_selector("ol.timeline > li")
    shown = page.locator("ol.timeline > li").evaluate_all("els => els.map(e => e.dataset.run)")
    assert shown == list(dict.fromkeys(r["runId"] for r in api_runs))
    shot(page, "job")


def test_replaying_dead_letters_one_and_all_selected_runs_them_again(
    page: Any, stack: Stack
) -> None:
    stack.gate.write_text("closed")
    jobs = all_jobs(stack.client.schedule_many([
        JobSpec(type="gated", payload={"gate": str(stack.gate), "n": i}, max_attempts=2,
                backoff_base_ms=0) for i in range(3)]))
    ids = {j.id for j in jobs}

    def letters() -> dict[str, dict[str, Any]]:
        return {d["runId"]: d for d in stack.api.get("/dead-letters").json()["deadLetters"]
                if d["jobId"] in ids}

    dead = stack.wait("three dead letters", lambda: d if len(d := letters()) == 3 else None)
    page.goto(f"{stack.base}/ui/#/dead-letters")
    for run_id in dead:
        page.wait_for_selector(f"tr[data-run='{run_id}']")
    assert page.locator("tbody tr").count() == len(stack.api.get("/dead-letters").json()
                                                   ["deadLetters"])
    first, *rest = sorted(dead)
    row = f"tr[data-run='{first}']"
    assert "gate" in text(page, f"{row} pre.err")
    assert page.locator(f"{row} time").get_attribute("datetime") == dead[first]["deadAt"]
    shot(page, "dead-letters")
    stack.gate.unlink()
    page.locator(row).get_by_role("button", name="Replay").click()
    page.wait_for_selector("#toast >> text='Replayed 1 run'")
    page.wait_for_selector(row, state="detached")
    for run_id in rest:  # select every row left, then replay the selection
        page.locator(f"tr[data-run='{run_id}'] input[type=checkbox]").check()
    page.get_by_role("button", name="Replay selected (2)").click()
    page.wait_for_selector("#toast >> text='Replayed 2 runs'")
    for run_id in rest:
        page.wait_for_selector(f"tr[data-run='{run_id}']", state="detached")
    stack.wait("every replayed run succeeds", lambda: all(
        stack.api.get(f"/jobs/{j}").json()["status"] == "completed" for j in ids))
    assert letters() == {}
    job = dead[first]["jobId"]
    page.goto(f"{stack.base}/ui/#/jobs/{job}")
    page.wait_for_selector("h1 [data-status=completed]")
    page.wait_for_selector(f"li[data-run='{first}'] .attempts [data-status=succeeded]")


def test_a_read_only_key_sees_everything_but_no_button(browser: Any, stack: Stack) -> None:
    job = stack.client.schedule("tick", cron="0 0 1 1 *", idempotency_key="read-only-view")
    with signed_in(browser, stack.base, stack.read) as p:
        p.wait_for_selector("[data-scope=read]")
        p.goto(f"{stack.base}/ui/#/jobs/{job.id}")
        p.wait_for_selector("h1 [data-status=scheduled]")
        p.wait_for_selector("text=read-only key")
        assert p.locator("button", has_text="Pause").count() == 0
        assert p.locator("button", has_text="Trigger").count() == 0
        p.goto(f"{stack.base}/ui/#/dead-letters")
        p.wait_for_selector("text=Replaying and deleting need an admin key")
        assert p.locator("button", has_text="Replay").count() == 0
        assert p.locator("button", has_text="Delete").count() == 0


def test_a_wrong_key_gets_the_sign_in_form(browser: Any, stack: Stack) -> None:
    context = browser.new_context()
    try:
        p = context.new_page()
        p.set_default_timeout(UI_TIMEOUT_MS)
        p.goto(f"{stack.base}/ui/#key=rsk_not-a-key")
        p.wait_for_selector("text=That key was not accepted.")
        p.fill("input[name=key]", stack.read)
        p.click("button[type=submit]")
        p.wait_for_selector("[data-scope=read]")
        p.wait_for_selector("[data-test=partitions-owned]")
    finally:
        context.close()


def test_dead_letters_show_error_and_payload_and_delete_one_then_all_matching(
    page: Any, stack: Stack
) -> None:
    gates = {g: stack.gate.with_name(f"gate-{g}") for g in ("a", "b")}
    for g in gates.values():
        g.write_text("closed")
    jobs = all_jobs(stack.client.schedule_many([
        JobSpec(type="gated", payload={"gate": str(gates[g]), "n": i}, max_attempts=1)
        for g, i in [("a", 0), ("a", 1), ("b", 2), ("b", 3), ("b", 4)]]))
    by_n = {j.payload["n"]: j.id for j in jobs}

    def letters() -> dict[int, str]:
        got = stack.api.get("/dead-letters", params={"limit": 200}).json()["deadLetters"]
        return {n: d["runId"] for d in got for n, j in by_n.items() if d["jobId"] == j}

    dead = stack.wait("five dead letters", lambda: d if len(d := letters()) == 5 else None)
    page.goto(f"{stack.base}/ui/#/dead-letters")
    row = f"tr[data-run='{dead[0]}']"
    page.wait_for_selector(row)
    page.click(f"{row} summary")  # opens the full error and the job's payload
    page.wait_for_selector(f"{row} pre.payload[data-loaded]")
    assert '"n": 0' in text(page, f"{row} pre.payload")
    full = text(page, f"{row} pre.err.full")  # the error with its traceback
    assert "gate" in full and "Traceback (most recent call last)" in full
    assert "dashboard_app.py" in full and ", in gated" in full
    assert str(gates["a"]) in text(page, f"{row} pre.payload")
    page.locator(row).get_by_role("button", name="Delete").click()
    page.locator(row).get_by_role("button", name="Really delete?").click()
    page.wait_for_selector("#toast >> text='Deleted 1 run'")
    page.wait_for_selector(row, state="detached")
    assert 0 not in letters()
    top = stack.api.get(f"/jobs/{by_n[0]}/runs").json()["runs"][0]
    assert top["status"] == "deleted" and "by dashboard-admin (key_" in top["error"]
    # Filter on gate b's path, select all that match (the dry run's count), delete them.
    page.fill("input[name=errorContains]", "gate-b")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_selector(f"tr[data-run='{dead[1]}']", state="detached")
    for n in (2, 3, 4):
        page.wait_for_selector(f"tr[data-run='{dead[n]}']")
    page.get_by_role("button", name="Select all matching").click()
    page.wait_for_selector("button >> text='All 3 matching selected (clear)'")
    shot(page, "dead-letters-purge")
    page.get_by_role("button", name="Delete all 3 matching").click()
    page.get_by_role("button", name="Really delete 3 dead letters?").click()
    page.wait_for_selector("#toast >> text='Deleted 3 dead letters'")
    for n in (2, 3, 4):
        page.wait_for_selector(f"tr[data-run='{dead[n]}']", state="detached")
    assert letters() == {1: dead[1]}
    for g in gates.values():
        g.unlink()


def _failing_yearly(stack: Stack, key: str) -> Any:
    """A cron job (next run next January) whose runs fail while the gate is closed; closes it."""
    stack.gate.write_text("closed")
    return stack.client.schedule("gated", payload={"gate": str(stack.gate)}, max_attempts=1,
                                 cron="0 0 1 1 *", idempotency_key=key)


def test_the_jobs_list_refreshes_by_itself_with_the_last_run_and_failure_streak(
    page: Any, stack: Stack
) -> None:
    failing = _failing_yearly(stack, "list-failing")
    fine = stack.client.schedule("tick", cron="0 0 1 1 *", idempotency_key="list-fine")
    page.goto(f"{stack.base}/ui/#/jobs")
    row = f"tr[data-job='{failing.id}']"
    page.wait_for_selector(f"{row} [data-test=last-run] >> text='—'")
    assert text(page, f"{row} td:nth-child(4)") == "scheduled"
    stack.api.post(f"/jobs/{failing.id}/trigger")
    stack.api.post(f"/jobs/{fine.id}/trigger")
    # No reload: the list reads the jobs again every 3 s; 20 s leaves the run time to spare.
    page.wait_for_selector(f"{row} [data-test=last-run] [data-status=dead]")
    page.wait_for_selector(f"{row} [data-test=streak] >> text='1 in a row'")
    page.wait_for_selector(f"tr[data-job='{fine.id}'] [data-test=last-run] [data-status=succeeded]")
    stack.api.post(f"/jobs/{failing.id}/trigger")
    page.wait_for_selector(f"{row} [data-test=streak] >> text='2 in a row'")
    assert text(page, f"{row} td:nth-child(4)") == "scheduled"  # the job's own status
    shot(page, "jobs-last-run")
    page.goto(f"{stack.base}/ui/#/jobs?lastRun=dead")
    page.wait_for_selector(f"tr[data-job='{fine.id}']", state="detached")
    page.wait_for_selector(row)
    api_ids = {j["id"] for j in stack.api.get("/jobs", params={"lastRun": "dead", "limit": 1000})
               .json()["jobs"]}
    shown = page.locator("tr[data-job]").evaluate_all("els => els.map(e => e.dataset.job)")
    assert set(shown) == api_ids
    stack.gate.unlink()


def test_a_job_page_marks_dead_runs_replays_them_shows_results_and_refreshes_after_a_prompt(
    page: Any, stack: Stack
) -> None:
    job = _failing_yearly(stack, "page-dead")
    dead_run = stack.api.post(f"/jobs/{job.id}/trigger").json()["runId"]
    stack.wait("a dead letter", lambda: any(
        d["runId"] == dead_run for d in stack.api.get("/dead-letters").json()["deadLetters"]))
    page.goto(f"{stack.base}/ui/#/jobs/{job.id}")
    li = f"ol.timeline > li[data-run='{dead_run}']"
    page.wait_for_selector(f"{li} .t-head [data-status=dead]")
    assert page.locator(f"{li} .attempts [data-status=failed]").count() == 1
    # Arm "Really cancel?" and walk away: the page goes on refreshing, and disarms.
    page.get_by_role("button", name="Cancel").click()
    page.wait_for_selector("button >> text='Really cancel?'")
    stack.gate.unlink()
    new_run = stack.api.post(f"/jobs/{job.id}/trigger").json()["runId"]
    new_li = f"ol.timeline > li[data-run='{new_run}']"
    page.wait_for_selector(f"{new_li} .t-head [data-status=succeeded]")
    page.wait_for_selector("button >> text='Cancel'")
    assert stack.api.get(f"/jobs/{job.id}").json()["status"] == "scheduled"
    assert "passed" in text(page, f"{new_li} pre.result")
    shot(page, "job-dead-run")
    page.locator(li).get_by_role("button", name="Replay").click()
    page.wait_for_selector(f"#toast >> text='Replayed {dead_run}'")
    page.wait_for_selector(f"{li} .t-head [data-status=succeeded]")
    assert page.locator(f"{li} button", has_text="Replay").count() == 0


def test_the_overview_charts_show_the_stored_history_at_first_load_then_go_on_live(
    browser: Any, stack: Stack
) -> None:
    stack.client.schedule("tick", cron="* * * * * *", idempotency_key="history-every-second")
    stack.wait("20 s of samples with runs in them", lambda: len(
        s := stack.api.get("/stats/overview").json()["samples"]) >= 20
        and s[-1]["succeeded"] > s[-20]["succeeded"])
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        p = context.new_page()
        p.set_default_timeout(UI_TIMEOUT_MS)
        p.goto(f"{stack.base}/ui/#key={stack.admin}")
        for chart in ("throughput", "lag", "backlog"):
            p.wait_for_selector(f"#chart-{chart}[data-first]:not([data-first=''])")
        # Points older than the page itself cannot come from its own polling: the stored ones.
        for chart in ("throughput", "backlog"):
            age_ms = p.evaluate(f"performance.timeOrigin - Number(document.querySelector("
                                f"'#chart-{chart}').dataset.first)")
            assert age_ms > 10_000, (chart, age_ms)
        first = int(p.locator("#chart-throughput").get_attribute("data-points") or 0)
        assert first >= 15
        p.wait_for_function("n => Number(document.querySelector('#chart-throughput')"
                            ".dataset.points) >= n + 3", arg=first)  # and live points follow
        shot(p, "overview-history")
    finally:
        context.close()


@pytest.mark.parametrize("browser_ahead_s", [0, 120])
def test_throughput_shows_at_first_load_from_a_stored_sample_read_mid_bucket(
    browser: Any, stack: Stack, browser_ahead_s: int
) -> None:
    """As with the production period (a minute): the newest stored sample is 30 s old and its
    t is its bucket's start, 45 s before it was read.  The first value shown, and each of the
    next 10 s, is the rate the stored samples give, not a rate over the wrong span or over a
    2 s window of heartbeat-stepped counters; also when the browser's clock is 2 min ahead of
    the API's."""
    stack.client.schedule("tick", cron="* * * * * *", idempotency_key="first-load-every-second")
    got = stack.wait("40 s of samples with runs in them", lambda: len(
        s := stack.api.get("/stats/overview").json()["samples"]) >= 40
        and s[-1]["started"] - s[-21]["started"] >= 15 and s, timeout_s=60)
    truth = (got[-1]["started"] - got[-21]["started"]) / ((got[-1]["at"] - got[-21]["at"]) / 1000)
    old = [x for x in got if x["at"] <= got[-1]["at"] - 30_000][-1]

    def minute_sampled(route: Any) -> None:
        res = route.fetch()
        route.fulfill(response=res, json={"sampleSeconds": 60, "samples": [
            dict(old, t=old["at"] - 45_000)]})

    with signed_in(browser, stack.base, stack.admin, ("**/stats/overview*", minute_sampled),
                   time.time() + browser_ahead_s) as p:
        ahead_s = p.evaluate("Date.now()") / 1000 - time.time()
        assert abs(ahead_s - browser_ahead_s) < 5
        p.wait_for_function("() => { const b = document.querySelector('[data-series=started]');"
                            " return b && b.textContent !== '—'; }")
        shown = [float(text(p, "[data-series=started]").removesuffix("/s"))]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            time.sleep(0.5)
            shown.append(float(text(p, "[data-series=started]").removesuffix("/s")))
        assert all(0.5 * truth <= v <= 1.6 * truth for v in shown), (truth, shown)
        # Each axis in one unit, with one number of decimals.
        for chart, units in (("throughput", {"/s"}), ("lag", {" ms", " s"}), ("backlog", {""})):
            labels = (p.locator(f"#chart-{chart}").get_attribute("data-axis") or "").split("|")
            got = [re.fullmatch(r"\d+(?:\.(\d+))?( ms| s|/s|)", x) for x in labels]
            assert len(labels) == 5 and all(got), (chart, labels)
            assert len({m[2] for m in got if m}) == 1 and got[0] and got[0][2] in units, labels
            assert len({len(m[1] or "") for m in got if m}) == 1, (chart, labels)
        shot(p, "overview-first-load")


def test_a_job_page_edits_the_schedule_policy_at_its_version_and_backfills_once_confirmed(
    page: Any, stack: Stack
) -> None:
    job = stack.client.schedule("tick", cron="*/2 * * * * *", overlap="skip", paused=True)
    page.goto(f"{stack.base}/ui/#/jobs/{job.id}")
    page.wait_for_selector("[data-test=overlap] >> text='skip'")
    assert text(page, "[data-test=version]") == "1"
    assert text(page, "[data-test=catch-up]") == "60 s"
    form = page.locator("[data-test=policy-form]")
    form.locator("select[name=overlap]").select_option("cancelPrevious")
    form.locator("select[name=misfire]").select_option("skip")
    form.locator("input[name=catchUpWindowSeconds]").fill("5")
    form.get_by_role("button", name="Save policy").click()
    page.wait_for_selector("[data-test=overlap] >> text='cancelPrevious'")
    got = stack.api.get(f"/jobs/{job.id}").json()
    assert (got["overlap"], got["misfire"], got["catchUpWindowSeconds"], got["version"]) == (
        "cancelPrevious", "skip", 5, 2)
    page.wait_for_selector("[data-test=version] >> text='2'")
    assert text(page, "[data-test=misfire]") == "skip"

    # Backfill the 10 s before the job existed: every 2 s, 5 occurrences.
    created_s = job.created_ms // 1000
    start, end = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s))
                  for s in (created_s - 10, created_s))
    page.fill("input[name=from]", start)
    page.fill("input[name=to]", end)
    # The backfill's own policy, bufferAll by default: the 5 one after another.
    page.get_by_role("button", name="Backfill…").click()
    page.wait_for_selector("[data-test=backfill-counts]")
    assert text(page, "[data-test=backfill-counts]") == (
        "1 would be queued, 0 already ran, 4 buffered by overlap")
    assert text(page, "[data-test=backfill-confirm]") == "Queue 1 run(s), buffer 4"
    page.locator("[data-test=backfill-overlap]").select_option("cancelPrevious")
    assert page.locator("[data-test=backfill-confirm]").count() == 0  # for the other policy
    page.get_by_role("button", name="Backfill…").click()
    page.wait_for_selector("[data-test=backfill-counts] >> text=/skipped/")
    dry = stack.api.post(f"/jobs/{job.id}/backfill", json={
        "from": start, "to": end, "dryRun": True, "overlap": "cancelPrevious"}).json()
    # cancelPrevious, as if the 5 came at once: the first would be queued, the second wait and
    # ask it to stop (not started yet, it never runs), the rest be skipped.
    assert text(page, "[data-test=backfill-counts]") == (
        "1 would be queued, 0 already ran, 3 skipped by overlap, 1 buffered by overlap")
    items = page.locator("[data-test=backfill-times] li")
    assert [li.split()[0] for li in items.all_inner_texts()] == dry["times"]
    fates = [items.nth(i).get_attribute("data-fate") for i in range(items.count())]
    assert fates == ["queued", "buffered", "skipped", "skipped", "skipped"]
    assert [t for t, f in zip(dry["times"], fates, strict=True) if f == "skipped"] == (
        dry["skipped"])
    assert text(page, "[data-test=backfill-confirm]") == "Queue 1 run(s), buffer 1"
    assert stack.api.get(f"/jobs/{job.id}/runs").json()["runs"] == []  # nothing ran yet
    shot(page, "job-backfill-confirm")
    # Editing the range withdraws the confirmation: it was for the range previewed.
    page.fill("input[name=to]", end)
    assert page.locator("[data-test=backfill-confirm]").count() == 0
    page.get_by_role("button", name="Backfill…").click()
    page.locator("[data-test=backfill-confirm]").click()
    page.wait_for_selector("[data-test=backfill-done]")
    assert text(page, "[data-test=backfill-done]") == (
        "Done: 1 queued, 0 already ran, 3 skipped by overlap, 1 buffered by overlap (of 5)")
    first, second = (ms_of(t) for t in dry["times"][:2])
    stack.wait("the buffered run", lambda: stack.client.get_run(
        f"{job.id}@{second}").state.value == "succeeded")
    assert stack.client.get_run(f"{job.id}@{first}").state.value == "cancelled"
    shot(page, "job-backfill-done")

    # A range with no occurrence (an odd second, every 2 s) has nothing to confirm.
    odd = (created_s - 20) | 1
    page.fill("input[name=from]", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(odd)))
    page.fill("input[name=to]", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(odd + 1)))
    page.get_by_role("button", name="Backfill…").click()
    page.wait_for_selector("[data-test=backfill-nothing]")
    assert page.locator("[data-test=backfill-confirm]").count() == 0


def test_runs_the_overlap_policy_kept_from_running_read_as_such_not_as_red_errors(
    browser: Any, stack: Stack, tmp_path: Path
) -> None:
    """With an archive (whose history has skipped runs, with the reason in their error): an
    API serving it and an archiver beside the stack's processes."""
    job = stack.client.schedule("tick", cron="* * * * * *", overlap="skip", paused=True)
    now = stack.client.now_ms() // 1000 * 1000
    res = stack.client.backfill(job.id, now - 3000, now, overlap="skip")
    assert (len(res.queued), len(res.skipped)) == (1, 2)
    port = free_port()
    env = dict(os.environ, RSCHED_REDIS_URL=stack.client.settings.redis_url, PYTHONUNBUFFERED="1",
               RSCHED_ARCHIVE_URL=f"sqlite:///{tmp_path / 'archive.db'}")
    procs = [Proc("archiver", ["archiver", "--poll-ms", "100"], env, tmp_path),
             Proc("api-archive", ["api", "--port", str(port)], env, tmp_path)]
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10,
                          headers={"Authorization": f"Bearer {stack.admin}"}) as api:
            runs = wait_for("the runs in the archive", lambda: (got := api.get(
                f"/jobs/{job.id}/runs").json()["runs"]) and len(
                {a["runId"] for a in got if a["status"] in ("skipped", "succeeded")}) == 3
                and got, procs)
        skipped = [a for a in runs if a["status"] == "skipped"]
        assert len(skipped) == 2 and all(a["error"].startswith("overlap: ") for a in skipped)
        with signed_in(browser, base, stack.admin) as p:
            p.wait_for_selector("#who >> text=dashboard-admin")
            p.goto(f"{base}/ui/#/jobs/{job.id}")
            for a in skipped:
                item = p.locator(f"li[data-run='{a['runId']}']")
                item.wait_for()
                assert "t-skipped" in (item.get_attribute("class") or "")
                assert item.locator(".status").first.inner_text() == "skipped"
                assert item.locator("pre.err").count() == 0
                assert item.locator("[data-test=reason]").inner_text() == a["error"]
                assert "not started" in item.inner_text()
            assert p.locator("ol.timeline pre.err").count() == 0
            shot(p, "job-skipped-runs")
    finally:
        for proc in procs:
            proc.stop()


def test_runs_skipped_by_overlap_are_listed_with_their_reason_from_redis_alone(
    page: Any, stack: Stack
) -> None:
    """The stack's API has no archive: a job's runs come from Redis's own history, which
    records each occurrence skipped while the job's run is still active."""
    gate = stack.gate.with_name("skip-gate")
    hold = Path(f"{gate}-0")  # the run goes on while it exists
    hold.touch()
    try:
        job = stack.client.schedule("stepped", {"gate": str(gate), "steps": []},
                                    cron="* * * * * *", overlap="skip")

        def skipped() -> list[dict[str, Any]]:
            runs = stack.api.get(f"/jobs/{job.id}/runs").json()["runs"]
            return [a for a in runs if a["status"] == "skipped"]

        stack.wait("two skipped occurrences", lambda: len(skipped()) >= 2)
        stack.client.pause(job.id)
        shown = skipped()[:2]
        active = stack.client.get_run(shown[0]["runId"]).error or ""
        assert active.startswith("overlap: run ") and active.endswith(" is still active")
        page.goto(f"{stack.base}/ui/#/jobs/{job.id}")
        for a in shown:
            assert a["error"] == active and a["attempt"] == 0
            item = page.locator(f"li[data-run='{a['runId']}']")
            item.wait_for()
            assert "t-skipped" in (item.get_attribute("class") or "")
            assert item.locator("[data-test=reason]").inner_text() == active
        shot(page, "job-skipped-runs-redis")
    finally:
        hold.unlink()


def ms_of(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def test_a_job_page_lists_the_lifecycle_fields_the_job_has_and_hides_absent_ones(
    page: Any, stack: Stack
) -> None:
    """Fields the page does not know are listed by name too: the API's answer is extended in
    the browser, as a newer API would send it."""
    res = stack.api.post("/jobs", json={"type": "tick", "cron": "0 0 1 1 *", "paused": True,
                                        "maxRuns": 7, "endAt": "2031-01-01T00:00:00Z"})
    assert res.status_code == 201, res.text
    job = res.json()
    assert job["startAt"] is None and job["pauseAfterFailures"] is None  # present, but null
    extra = {"pauseNote": "maintenance", "fromANewerApi": 3}

    def with_extra(route: Any) -> None:
        res = route.fetch()
        route.fulfill(response=res, json={**res.json(), **extra})

    page.route(f"**/jobs/{job['id']}", with_extra)
    page.goto(f"{stack.base}/ui/#/jobs/{job['id']}")
    page.wait_for_selector("[data-test=life-maxRuns]")
    shown = {(a or "").removeprefix("life-") for a in page.locator(
        "dt[data-test^=life-]").evaluate_all("ds => ds.map((d) => d.dataset.test)")}
    assert shown == {"maxRuns", "remainingRuns", "endAt", "pauseNote", "fromANewerApi"}
    for name, label in (("maxRuns", "Max Runs"), ("remainingRuns", "Remaining Runs"),
                        ("pauseNote", "Pause Note"), ("endAt", "End At")):
        assert text(page, f"[data-test=life-{name}]") == label
    assert text(page, "[data-test=life-pauseNote] + dd") == "maintenance"
    assert text(page, "[data-test=life-maxRuns] + dd") == "7"
    assert page.locator("[data-test=life-endAt] + dd time").get_attribute("datetime") == (
        job["endAt"])
    shot(page, "job-lifecycle")


def test_times_more_than_a_week_away_read_as_dates(page: Any, stack: Stack) -> None:
    job = stack.client.schedule("tick", run_at="2030-01-01T00:00:00Z")
    page.goto(f"{stack.base}/ui/#/jobs?status=scheduled&type=tick")
    cell = page.locator(f"tr[data-job='{job.id}'] td:last-child")
    cell.wait_for()
    # Local time: the zone of the browser, which the test does not fix.
    want = page.evaluate("() => { const d = new Date('2030-01-01T00:00:00Z');"
                         " return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}"
                         "-${String(d.getDate()).padStart(2, '0')}`; }")
    assert cell.inner_text().strip() == want
    soon = stack.client.schedule("tick", run_at=stack.client.now_ms() + 3 * 86_400_000)
    page.wait_for_selector(f"tr[data-job='{soon.id}'] td:last-child >> text=/^in 3\\.0 d$/")
    shot(page, "jobs-far-dates")
    page.goto(f"{stack.base}/ui/#/jobs/{job.id}")
    page.wait_for_selector("[data-test=next-run] time")
    assert text(page, "[data-test=next-run]") == text(page, "[data-test=next-run] time")


def test_the_overview_shows_a_dead_worker_as_dead_and_flags_a_queue_no_live_worker_reads(
    page: Any, stack: Stack
) -> None:
    import msgpack

    from rsched.rdb import keys

    now = stack.client.now_ms()
    stack.client.r.hset(keys.workers(), "ghost-worker", msgpack.packb({
        "queues": ["ghosts"], "inflight": 5, "pid": 1, "host": "h", "beat_ms": now - 60_000,
        "concurrency": 8, "types": ["tick"], "heartbeat_ms": 5000}))
    stack.client.schedule("tick", queue="ghosts")
    try:
        page.goto(f"{stack.base}/ui/#/")
        row = page.locator("tr[data-worker='ghost-worker']")
        row.locator("td[data-state=dead]").wait_for()
        assert text(page, "tr[data-worker='ghost-worker'] td[data-state]").startswith("dead ")
        assert text(page, "tr[data-worker='ghost-worker'] td:nth-child(3)") == "—"
        page.wait_for_selector("[data-test=unserved-ghosts] >> text='1'")
        assert "bad" in (page.locator("tr[data-queue=ghosts]").get_attribute("class") or "")
        shot(page, "overview-dead-worker")
    finally:
        stack.client.r.hdel(keys.workers(), "ghost-worker")


def test_the_overview_flags_a_job_type_no_live_worker_has_the_handler_for(
    page: Any, stack: Stack
) -> None:
    """The worker sets the run aside unrun; the overview names its queue and type as the API's
    status does, then drops them once the job is cancelled and its entry let go."""
    job = stack.client.schedule("nobody-has-this")
    want = [{"queue": "default", "type": "nobody-has-this", "runs": 1, "served": False}]
    stack.wait("the run to be set aside",
               lambda: stack.api.get("/status").json()["waitingForHandler"] == want)
    page.wait_for_selector("[data-test=waiting-runs] >> text='1'")
    row = "tr[data-waiting='default nobody-has-this']"
    page.wait_for_selector(row)
    assert [text(page, f"{row} td:nth-child({i})") for i in (1, 2, 3, 4)] == [
        "default", "nobody-has-this", "1", "none live"]
    shot(page, "overview-waiting-for-a-handler")
    stack.client.cancel(job.id)
