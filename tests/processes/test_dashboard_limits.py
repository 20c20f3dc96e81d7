"""The dashboard's Limits page and a running run's live progress, in real headless Chromium
against the real `rsched api`, `rsched dispatcher` and `rsched worker`: what the page does
the HTTP API then answers, and the job page's progress bar moves with the job's events stream."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.api_process import Api, running_api
from support.browser import ARTIFACTS, dashboard_page
from support.processes import Proc, wait_for
from support.redis_server import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]
RUNS_LIST = re.compile(r"/jobs/[^/]+/runs\?")


class Stack:
    def __init__(self, api: Api, procs: list[Proc], http: httpx.Client, gate: Path) -> None:
        self.api, self.procs, self.http, self.gate = api, procs, http, gate

    def wait(self, what: str, check: Any) -> Any:
        return wait_for(what, check, [self.api.proc, *self.procs])

    def stepped(self, name: str, steps: list[Any], **spec: Any) -> str:
        """A 'stepped' job held at each step until the test removes that step's gate file."""
        gate = self.gate.with_name(f"gate-{name}")
        for i in range(len(steps) + 1):
            Path(f"{gate}-{i}").write_text("closed")
        res = self.http.post("/jobs", json={"type": "stepped", "payload": {
            "gate": str(gate), "steps": steps}, **spec})
        res.raise_for_status()
        return str(res.json()["id"])


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API (with an admin and a read key), a dispatcher and a worker of the test app."""
    redis_server.resume()
    if not redis_server.is_running():
        redis_server.start()
    tmp = tmp_path_factory.mktemp("dashboard-limits")
    env = dict(os.environ, RSCHED_REDIS_URL=redis_server.url, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    with running_api(redis_server.url, tmp) as api, api.http(api.admin) as http:
        procs = [Proc("dispatcher", ["dispatcher", "--max-sleep-ms", "200"], env, tmp),
                 Proc("worker", ["worker", "--app", "support.dashboard_app:app"], env, tmp)]
        try:
            yield Stack(api, procs, http, tmp / "gate")
        finally:
            for p in procs:
                p.stop()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    with dashboard_page(browser, stack.api.base, stack.api.admin, "http-admin") as p:
        yield p


def fill(page: Any, **fields: str) -> None:
    for name, value in fields.items():
        page.fill(f"[data-test=limit-form] input[name='{name.replace('_', '.')}']", value)


def cell(page: Any, name: str, test: str) -> str:
    return str(page.inner_text(f"tr[data-limit='{name}'] [data-test={test}]")).strip()


def test_a_limit_is_created_edited_and_deleted_on_the_limits_page_as_the_api_then_says(
    page: Any, stack: Stack
) -> None:
    page.click("nav a[data-nav=limits]")
    page.wait_for_selector("text=No limits defined")
    fill(page, name="tenant-7", concurrency="2")
    page.click("[data-test=limit-form] button[type=submit]")
    page.wait_for_selector("tr[data-limit='tenant-7']")
    assert stack.http.get("/limits/tenant-7").json() == {
        "name": "tenant-7", "concurrency": 2, "rate": None, "inFlight": 0, "waiting": 0,
        "busiestKeys": []}
    assert cell(page, "tenant-7", "in-flight") == "0"
    fill(page, name="tenant-*", rate_limit="10", rate_periodSeconds="1.5")
    page.click("[data-test=limit-form] button[type=submit]")
    page.wait_for_selector("tr[data-limit='tenant-*']")
    assert cell(page, "tenant-*", "rate") == "10 per 1.5 s"
    assert cell(page, "tenant-*", "in-flight") == "per key"
    # The API's 422 names the field; the page shows it next to that field and stores nothing.
    fill(page, name="bad", concurrency="0", rate_limit="", rate_periodSeconds="")
    page.click("[data-test=limit-form] button[type=submit]")
    err = page.wait_for_selector("[data-error=concurrency]:not([hidden])")
    assert err.inner_text() == "concurrency: must be an integer from 1 to 1,000,000"
    fill(page, concurrency="", rate_limit="5", rate_periodSeconds="0")
    page.click("[data-test=limit-form] button[type=submit]")
    err = page.wait_for_selector("[data-error='rate.periodSeconds']:not([hidden])")
    assert "rate.periodSeconds: must be above 0" in err.inner_text()
    assert page.is_hidden("[data-error=concurrency]")
    assert stack.http.get("/limits/bad").status_code == 404
    # A run of the key holds a slot: the page's count shows it (read again every 5 s).
    held = stack.stepped("held", [], limitKey="tenant-7")
    page.wait_for_selector("tr[data-limit='tenant-7'] [data-test=in-flight] >> text='1'")
    # Edit: the form takes the row's values, and Save replaces the definition.
    page.locator("tr[data-limit='tenant-7']").get_by_role("button", name="Edit").click()
    assert page.input_value("input[name=concurrency]") == "2"
    assert page.get_attribute("input[name=name]", "readonly") is not None
    fill(page, concurrency="5", rate_limit="3", rate_periodSeconds="2")
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector("tr[data-limit='tenant-7'] [data-test=concurrency] >> text='5'")
    view = stack.http.get("/limits/tenant-7").json()
    assert {k: v for k, v in view.items() if k != "busiestKeys"} == {
        "name": "tenant-7", "concurrency": 5, "rate": {"limit": 3, "periodSeconds": 2},
        "inFlight": 1, "waiting": 0}
    # Its start was logged before it had a rate: the window counts starts from then on.
    assert view["busiestKeys"] == [{"key": "tenant-7", "inFlight": 1, "waiting": 0,
                                    "recentStarts": 0}]
    assert page.input_value("input[name=name]") == ""  # back to a new limit
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-limits.png"), full_page=True)
    row = page.locator("tr[data-limit='tenant-7']")
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Really delete?").click()
    page.wait_for_selector("tr[data-limit='tenant-7']", state="detached")
    assert stack.http.get("/limits/tenant-7").status_code == 404
    assert [x["name"] for x in stack.http.get("/limits").json()["limits"]] == ["tenant-*"]
    Path(f"{stack.gate.with_name('gate-held')}-0").unlink()
    stack.wait("the held run ends", lambda: stack.http.get(f"/jobs/{held}").json()["status"]
               == "completed")


def test_each_definitions_busiest_keys_show_their_runs_in_flight_waiting_and_rate_use(
    page: Any, stack: Stack
) -> None:
    stack.http.put("/limits/acct-*", json={"concurrency": 2, "rate": {
        "limit": 100, "periodSeconds": 3600}}).raise_for_status()
    page.click("nav a[data-nav=limits]")
    page.wait_for_selector("tr[data-limit='acct-*'] [data-test=busiest] >> text='none busy'")
    # acct-1: two held runs and a third waiting for its concurrency; acct-2: one held run.
    held = [stack.stepped(f"acct-{i}", [], limitKey=key)
            for i, key in enumerate(["acct-1", "acct-1", "acct-2", "acct-1"])]
    busiest = "tr[data-limit='acct-*'] [data-test=busiest]"
    page.wait_for_selector(f"{busiest} [data-key='acct-1'] [data-test=key-waiting] >> text='1'")
    page.wait_for_selector(f"{busiest} [data-key='acct-2'] [data-test=key-in-flight] >> text='1'")
    shown = [(str(row.get_attribute("data-key")), *(row.query_selector(
        f"[data-test=key-{t}]").inner_text() for t in ("in-flight", "waiting", "rate")))
             for row in page.query_selector_all(f"{busiest} [data-key]")]
    assert shown == [("acct-1", "2", "1", "2/100"), ("acct-2", "1", "0", "1/100")]
    listed = stack.http.get("/limits", params={"busiest": 1}).json()["limits"]
    assert [x["busiestKeys"] for x in listed if x["name"] == "acct-*"] == [[
        {"key": "acct-1", "inFlight": 2, "waiting": 1, "recentStarts": 2}]]
    assert stack.http.get("/limits", params={"busiest": 101}).status_code == 422
    for i in range(len(held)):
        Path(f"{stack.gate.with_name(f'gate-acct-{i}')}-0").unlink()
    for job in held:
        stack.wait("the held runs end", lambda job=job: stack.http.get(f"/jobs/{job}").json()[
            "status"] == "completed")
    # Nothing in flight or waiting; the starts stay in the hour's window.
    page.wait_for_selector(f"{busiest} [data-key='acct-1'] [data-test=key-rate] >> text='3/100'")
    assert page.inner_text(f"{busiest} [data-key='acct-1'] [data-test=key-in-flight]") == "0"
    stack.http.delete("/limits/acct-*").raise_for_status()


def test_a_read_only_key_sees_the_limits_but_no_form_or_button(browser: Any, stack: Stack) -> None:
    stack.http.put("/limits/viewer-*", json={"concurrency": 3}).raise_for_status()
    with dashboard_page(browser, stack.api.base, stack.api.read, "http-reader") as p:
        p.goto(f"{stack.api.base}/ui/#/limits")
        p.wait_for_selector("tr[data-limit='viewer-*']")
        p.wait_for_selector("text=need a write key")
        assert p.locator("[data-test=limit-form]").count() == 0
        assert p.locator("tr[data-limit] button").count() == 0


def _without_progress(route: Any) -> None:
    """The runs list as the API answers it but with no run's progress: what the page then
    shows of progress came from the events stream."""
    res = route.fetch()
    body = res.json()
    for run in body["runs"]:
        run["progress"] = None
    route.fulfill(response=res, json=body)


def test_a_running_runs_progress_moves_live_on_its_job_page_from_the_events_stream(
    page: Any, stack: Stack
) -> None:
    page.route(RUNS_LIST, _without_progress)
    job = stack.stepped("progress", [30, 70, {"rows": 7}])
    gate = stack.gate.with_name("gate-progress")
    page.goto(f"{stack.api.base}/ui/#/jobs/{job}")
    page.wait_for_selector(".attempts [data-status=running]")
    run_id = stack.http.get(f"/jobs/{job}/runs").json()["runs"][0]["runId"]
    seen = []
    for i, value in enumerate(["30%", "70%"]):
        Path(f"{gate}-{i}").unlink()
        shown = page.wait_for_selector(f"[data-test=progress][data-run='{run_id}'] "
                                       f"[data-test=progress-value] >> text='{value}'")
        assert shown.evaluate("e => e.previousElementSibling.value") == int(value[:-1])
        assert page.inner_text("[data-test=progress-message]") == f"step {i + 1}"
        seen.append(value)
    assert seen == ["30%", "70%"]
    Path(f"{gate}-2").unlink()  # an object: its JSON, compact, and the message; no bar
    page.wait_for_selector("[data-test=progress-json] >> text='{\"rows\":7}'")
    assert page.inner_text("[data-test=progress-message]") == "step 3"
    assert page.locator("[data-test=progress] progress").count() == 0
    assert stack.http.get(f"/runs/{run_id}").json()["progress"]["value"] == {"rows": 7}
    Path(f"{gate}-3").unlink()
    page.wait_for_selector(f"li[data-run='{run_id}'] .attempts [data-status=succeeded]")
    assert page.locator("[data-test=progress]").count() == 0
