"""Runs that end without running, listed where a user looks: occurrences an overlap policy skipped
(skip, bufferOne's overflow), the gap a catch-up window recorded, and runs ended straight from
the retry set (a cancelled job's retry, cancelPrevious) are in the job's history like any other
ended attempt, with their reason: GET /jobs/{id}/runs (keyset-paged exactly), the events view (the
archive's) and `rsched jobs runs`.  Stepped by hand: a real Dispatcher and Worker, real
redis-server, an injected clock."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from starlette.testclient import TestClient
from support.cli import as_json, ok
from support.helpers import ManualClock, Rig, run_of, settings

from rsched import App, Client, JobContext, RunState
from rsched.api.app import create_app
from rsched.core.spec import ms_to_iso

MINUTE = 60_000


def app_of() -> App:
    app = App("skipped")

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    return app


def every_minute(client: Client, jtype: str, **options: Any) -> tuple[str, int]:
    job = client.schedule(jtype, cron="* * * * *", **options)
    assert job.next_ms is not None
    return job.id, job.next_ms


def all_pages(api: TestClient, job_id: str, limit: int) -> list[dict[str, Any]]:
    """Every run GET /jobs/{id}/runs lists, page by page (the keyset cursor)."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        res = api.get(f"/jobs/{job_id}/runs", params=params)
        assert res.status_code == 200, res.text
        body = res.json()
        out += body["runs"]
        cursor = body["nextCursor"]
        if cursor is None:
            return out


def test_overlap_skips_are_listed_with_their_reason_and_paged_exactly(
    redis_url: str, client: Client, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "boom", overlap="bufferOne", max_attempts=1)
    a, b, c, d = (f"{job_id}@{t0 + k * MINUTE}" for k in range(4))

    async def scenario() -> None:
        async with Rig(redis_url, app_of(), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1  # a
            clock.ms = t0 + MINUTE
            await rig.claim()  # b buffered behind a
            clock.ms = t0 + 2 * MINUTE
            assert (await rig.claim()).skipped == 1  # c: a active, b waits already
            clock.ms = t0 + 3 * MINUTE
            assert (await rig.claim()).skipped == 1  # d likewise

    asyncio.run(scenario())
    why = f"overlap: run {a} of this job is still active and {b} waits already"
    with TestClient(create_app(settings(redis_url), auth=False)) as api:
        whole = api.get(f"/jobs/{job_id}/runs", params={"limit": 100}).json()
        assert whole["nextCursor"] is None
        listed = [(x["runId"], x["attempt"], x["status"], x["error"]) for x in whole["runs"]]
        # The in-flight run first, then the ended ones newest first: the two skips.
        assert listed == [(a, 1, "dispatched", None), (d, 0, "skipped", why),
                          (c, 0, "skipped", why)]
        assert [x["scheduledAt"] for x in whole["runs"][1:]] == [
            run_json_time(d), run_json_time(c)]
        # One run a page: each run once, in the same order, none lost between pages.
        assert all_pages(api, job_id, 1) == whole["runs"]
    # The events' view (what the archive keeps) agrees.
    seen = {x.run_id: (x.attempt, x.status, x.error) for x in client.history(job_id).items}
    assert seen[c] == seen[d] == (0, "skipped", why)
    # `rsched jobs runs` prints them with their reason.
    text = ok(redis_url, "jobs", "runs", job_id)
    marked = [line for line in text.splitlines() if " skipped " in line and "overlap: run" in line]
    assert len(marked) == 2
    assert [x["runId"] for x in as_json(redis_url, "jobs", "runs", job_id)["runs"]] == [a, d, c]


def run_json_time(run_id: str) -> str | None:
    """The scheduledAt the API gives a run id's occurrence."""
    return ms_to_iso(int(run_id.rpartition("@")[2]))


def test_a_catch_up_gap_is_listed_as_one_skipped_run_with_its_count(
    redis_url: str, client: Client, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "boom", misfire="skip")
    clock.ms = t0 + 10 * MINUTE + MINUTE // 2  # 0..9 are older than the 60 s window

    async def scenario() -> None:
        async with Rig(redis_url, app_of(), clock=clock) as rig:
            assert (await rig.claim()).skipped == 10  # 0..9: the gap, none of them run
            assert (await rig.claim()).dispatched == 1  # 10, 30 s late: inside the window

    asyncio.run(scenario())
    gap_run = f"{job_id}@{t0}"
    ran = f"{job_id}@{t0 + 10 * MINUTE}"
    [inflight, gap] = client.runs(job_id)
    assert (inflight.run_id, inflight.status) == (ran, "dispatched")
    assert (gap.run_id, gap.attempt, gap.status) == (gap_run, 0, "skipped")
    assert gap.error is not None and gap.error.startswith("catch-up: 10 occurrence(s) up to ")
    assert [(x.run_id, x.status, x.error) for x in client.history(job_id).items
            if x.status == "skipped"] == [(gap_run, "skipped", gap.error)]


def test_a_retry_ended_from_the_retry_set_is_recorded_as_the_attempt_it_waited_to_make(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    # A cancelled job's pending retry is abandoned by the claim, never run: its history says so.
    job_id, t0 = every_minute(client, "boom", max_attempts=3, backoff_base_ms=MINUTE)
    a = f"{job_id}@{t0}"

    async def scenario() -> None:
        async with Rig(redis_url, app_of(), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1
            assert await rig.fetch() == 1 and await rig.finish() == 1
            assert run_of(client, a).state is RunState.RETRY_WAIT
            client.cancel(job_id)
            clock.ms = t0 + 10 * MINUTE
            assert (await rig.claim()).dispatched == 0

    asyncio.run(scenario())
    assert run_of(client, a).state is RunState.ABANDONED
    listed = [(x.run_id, x.attempt, x.status, x.error) for x in client.runs(job_id)]
    assert listed == [(a, 2, "abandoned", "job cancelled before the retry ran"),
                      (a, 1, "failed", listed[1][3])]
    seen = [(x.attempt, x.status) for x in client.history(job_id).items]
    assert seen == [(2, "abandoned"), (1, "failed")]
