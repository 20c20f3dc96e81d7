"""GET /jobs and `rsched jobs list` show each job's latest run (status, time) and its current
failure streak, and filter by the latest run's status; real redis-server, real engine loops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient
from support.helpers import Rig
from support.helpers import settings as _settings

from rsched import App, JobContext
from rsched.api.app import create_app
from rsched.cli.main import cli

LATER = "2030-01-01T00:00:00Z"


def _app() -> App:
    app = App("jobs-list-test")

    @app.job("flaky")
    def flaky(ctx: JobContext) -> str:
        if ctx.payload["fail"]:
            raise RuntimeError("flaky failed")
        return "fine"

    return app


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


def _listed(api: TestClient, **params: str) -> dict[str, dict[str, Any]]:
    res = api.get("/jobs", params={"limit": 100, **params})
    assert res.status_code == 200, res.text
    return {j["id"]: j for j in res.json()["jobs"]}


def _run_until_settled(api: TestClient, redis_url: str, job_ids: list[str]) -> None:
    """Engine cycles until no listed job's latest run is still on its way (at most 20)."""
    async def go() -> None:
        async with Rig(redis_url, _app()) as rig:
            for _ in range(20):
                await rig.cycle()
                jobs = _listed(api)
                if all(jobs[j]["lastRun"]["status"] not in (None, "dispatched", "running")
                       for j in job_ids):
                    return
        raise AssertionError("runs did not finish in 20 engine cycles")

    asyncio.run(go())


def _trigger(api: TestClient, redis_url: str, job_id: str) -> str:
    res = api.post(f"/jobs/{job_id}/trigger")
    assert res.status_code == 202, res.text
    _run_until_settled(api, redis_url, [job_id])
    return str(res.json()["runId"])


def test_the_list_shows_the_latest_run_and_counts_failures_back_to_the_last_success(
    api: TestClient, redis_url: str
) -> None:
    job = api.post("/jobs", json={"type": "flaky", "payload": {"fail": True}, "runAt": LATER,
                                  "maxAttempts": 1}).json()
    fresh = _listed(api)[job["id"]]["lastRun"]
    assert fresh == {"runId": None, "status": None, "at": None, "failureStreak": 0,
                     "streakCapped": False}
    for n in (1, 2, 3):
        run_id = _trigger(api, redis_url, job["id"])
        last = _listed(api)[job["id"]]["lastRun"]
        assert (last["runId"], last["status"], last["failureStreak"]) == (run_id, "dead", n)
        assert last["at"] is not None and last["at"].endswith("Z")
    # The job's status says nothing of it: a job due in 2030 is "scheduled".
    assert _listed(api)[job["id"]]["status"] == "scheduled"
    api.patch(f"/jobs/{job['id']}", json={"payload": {"fail": False}})
    ok_run = _trigger(api, redis_url, job["id"])
    last = _listed(api)[job["id"]]["lastRun"]
    assert (last["runId"], last["status"], last["failureStreak"]) == (ok_run, "succeeded", 0)
    api.patch(f"/jobs/{job['id']}", json={"payload": {"fail": True}})
    _trigger(api, redis_url, job["id"])
    assert _listed(api)[job["id"]]["lastRun"]["failureStreak"] == 1


def test_last_run_filters_failed_dead_and_succeeded(api: TestClient, redis_url: str) -> None:
    dead = api.post("/jobs", json={"type": "flaky", "payload": {"fail": True},
                                   "maxAttempts": 1}).json()["id"]
    retrying = api.post("/jobs", json={"type": "flaky", "payload": {"fail": True},
                                       "maxAttempts": 2,
                                       "backoff": {"baseSeconds": 3600}}).json()["id"]
    ok = api.post("/jobs", json={"type": "flaky", "payload": {"fail": False}}).json()["id"]
    never = api.post("/jobs", json={"type": "flaky", "payload": {}, "runAt": LATER}).json()["id"]
    _run_until_settled(api, redis_url, [dead, retrying, ok])
    listed = _listed(api)
    assert listed[retrying]["lastRun"]["status"] == "failed"  # waiting for its retry
    assert listed[retrying]["lastRun"]["failureStreak"] == 1
    assert listed[dead]["lastRun"]["status"] == "dead"
    assert listed[ok]["lastRun"]["status"] == "succeeded"
    assert set(_listed(api, lastRun="failed")) == {dead, retrying}
    assert set(_listed(api, lastRun="dead")) == {dead}
    assert set(_listed(api, lastRun="succeeded")) == {ok}
    assert never in _listed(api)
    for job_id in (dead, retrying, ok, never):  # the single job says what the list says
        assert api.get(f"/jobs/{job_id}").json() == listed[job_id]
    # The job's runs say which run is a dead letter (its newest attempt), not only "failed".
    runs = api.get(f"/jobs/{dead}/runs").json()["runs"]
    assert [(r["status"], r["deadLettered"]) for r in runs] == [("failed", True)]
    runs = api.get(f"/jobs/{retrying}/runs").json()["runs"]
    assert [r["deadLettered"] for r in runs] == [False, False]  # in flight, then attempt 1
    # Paging with the filter visits every match once.
    seen, cursor = [], None
    while True:
        params = {"lastRun": "failed", "limit": "1", **({"cursor": cursor} if cursor else {})}
        page = api.get("/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        if not (cursor := page["nextCursor"]):
            break
    assert sorted(seen) == sorted([dead, retrying])
    res = api.get("/jobs", params={"lastRun": "broken"})
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "lastRun"


def test_rsched_jobs_list_shows_the_last_run_and_filters_by_it(
    api: TestClient, redis_url: str
) -> None:
    dead = api.post("/jobs", json={"type": "flaky", "payload": {"fail": True},
                                   "maxAttempts": 1}).json()["id"]
    ok = api.post("/jobs", json={"type": "flaky", "payload": {"fail": False}}).json()["id"]
    _run_until_settled(api, redis_url, [dead, ok])

    def rsched(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--redis-url", redis_url, "--log-level", "ERROR",
                                        "jobs", "list", *args], catch_exceptions=False)

    out = rsched("--last-run", "dead", "--json")
    jobs = json.loads(out.stdout)["jobs"]
    assert [(j["id"], j["lastRun"]["status"], j["lastRun"]["failureStreak"]) for j in jobs] == [
        (dead, "dead", 1)]
    table = rsched().stdout
    row = next(line for line in table.splitlines() if line.startswith(dead))
    assert " dead " in row and "1 in a row" in row
    assert "succeeded" in next(line for line in table.splitlines() if line.startswith(ok))
    bad = rsched("--last-run", "broken")
    assert bad.exit_code == 2 and "--last-run" in bad.stderr
