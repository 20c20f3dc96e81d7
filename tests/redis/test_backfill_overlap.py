"""A backfill's own overlap policy (Temporal's backfill takes one): bufferAll by default runs the
occurrences one after another, never beside a live run of the job, and a second bufferAll
backfill queues behind the first; the job's policies may be asked for instead.  The API, the
Python client and the CLI take it.  Stepped by hand: a real Dispatcher and Worker, real
redis-server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis
from starlette.testclient import TestClient
from support.cli import as_json, rsched, run_main
from support.helpers import Rig, job_field, problem_of, run_of, settings

from rsched import App, Client, JobContext, RunState
from rsched.api.app import create_app
from rsched.core.models import Job
from rsched.core.times import ms_to_iso

S = 1000
LIVE = ("dispatched", "running", "retry_wait")


def every_second(client: Client, **kw: Any) -> tuple[Job, int]:
    """A paused every-second job and a whole second of Redis's clock at or before now."""
    job = client.schedule("record", cron="* * * * * *", paused=True, **kw)
    return job, client.now_ms() // S * S


def recording_app(log: list[str]) -> App:
    app = App("backfill-overlap")

    @app.job("record")
    def record(ctx: JobContext) -> None:
        log.append(ctx.run_id)

    return app


def live_runs(client: Client, job_id: str, times: list[int]) -> list[str]:
    """The runs of ``times`` that are dispatched, running or waiting for a retry."""
    runs = client.run(client.op_read_runs([f"{job_id}@{t}" for t in times]))
    return [r.id for r in runs if r is not None and r.state.value in LIVE]


async def run_one_at_a_time(rig: Rig, client: Client, job_id: str, times: list[int]) -> None:
    """Claim, run and report until nothing is left, checking after each claim that at most one
    run of the job is live."""
    for _ in range(3 * len(times) + 5):
        claimed = await rig.claim()
        assert len(live_runs(client, job_id, times)) <= 1
        started = await rig.fetch()
        await rig.finish()
        if not claimed.dispatched and not started:
            return


def test_a_buffer_all_backfill_runs_its_occurrences_one_after_another_in_order(
    redis_url: str, client: Client
) -> None:
    # The job's own policy allows overlap: the backfill's bufferAll still runs one at a time.
    job, now = every_second(client)
    times = [now - k * S for k in range(5, 0, -1)]
    res = client.backfill(job.id, times[0], now)
    assert (res.overlap.value, res.queued, res.buffered, res.skipped) == (
        "bufferAll", times[:1], times[1:], [])
    for t in times[1:]:
        assert run_of(client, f"{job.id}@{t}").state is RunState.BUFFERED
    log: list[str] = []

    async def scenario() -> None:
        async with Rig(redis_url, recording_app(log)) as rig:
            await run_one_at_a_time(rig, client, job.id, times)

    asyncio.run(scenario())
    assert log == [f"{job.id}@{t}" for t in times]  # each once, in nominal order
    assert all(run_of(client, f"{job.id}@{t}").state is RunState.SUCCEEDED for t in times)
    assert job_field(client.r, job.id, "active") is None


def test_a_buffer_all_backfill_waits_for_the_jobs_live_run_and_a_second_one_for_the_first(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    job, now = every_second(client, overlap="skip")
    live = client.backfill(job.id, now - S, now, overlap="skip")  # the job's active run
    assert len(live.queued) == 1
    first = client.backfill(job.id, now - 4 * S, now - 2 * S)
    second = client.backfill(job.id, now - 6 * S, now - 4 * S)
    assert (first.queued, second.queued) == ([], [])  # all wait: a run of the job is active
    assert len(first.buffered) == len(second.buffered) == 2
    order = [now - S, now - 4 * S, now - 3 * S, now - 6 * S, now - 5 * S]
    log: list[str] = []

    async def scenario() -> None:
        async with Rig(redis_url, recording_app(log)) as rig:
            await run_one_at_a_time(rig, client, job.id, order)

    asyncio.run(scenario())
    assert log == [f"{job.id}@{t}" for t in order]
    assert job_field(r, job.id, "active") is None and job_field(r, job.id, "bq") is None


def test_a_backfill_may_take_one_of_the_jobs_policies_and_records_its_skips(
    client: Client
) -> None:
    job, now = every_second(client)  # allow
    dry = client.backfill(job.id, now - 3 * S, now, dry_run=True, overlap="skip")
    res = client.backfill(job.id, now - 3 * S, now, overlap="skip")
    assert (dry.queued, dry.skipped) == (res.queued, res.skipped) == (
        [now - 3 * S], [now - 2 * S, now - S])
    why = f"overlap: run {job.id}@{now - 3 * S} of this job is still active"
    skipped = [(a.run_id, a.status, a.error) for a in client.runs(job.id)
               if a.status == "skipped"]
    assert skipped == [(f"{job.id}@{now - S}", "skipped", why),
                       (f"{job.id}@{now - 2 * S}", "skipped", why)]
    buffered = client.backfill(job.id, now - 6 * S, now - 3 * S, dry_run=True)
    assert (buffered.queued, buffered.buffered) == ([], [now - 6 * S, now - 5 * S, now - 4 * S])


def test_the_api_and_the_cli_take_the_backfills_overlap_and_name_a_bad_one(
    redis_url: str, client: Client
) -> None:
    job, now = every_second(client)
    start, end = ms_to_iso(now - 3 * S) or "", ms_to_iso(now) or ""
    body: dict[str, Any] = {"from": start, "to": end, "dryRun": True}
    with TestClient(create_app(settings(redis_url), auth=False)) as api:
        plain = api.post(f"/jobs/{job.id}/backfill", json=body).json()
        assert (plain["overlap"], plain["counts"]) == (
            "bufferAll", {"queued": 1, "alreadyRun": 0, "skipped": 0, "buffered": 2})
        skip = api.post(f"/jobs/{job.id}/backfill", json=body | {"overlap": "skip"}).json()
        assert (skip["overlap"], skip["counts"]["skipped"]) == ("skip", 2)
        for bad in ("bufferall", "", 3, None):  # wrong case, empty, not a string
            detail = problem_of(api.post(f"/jobs/{job.id}/backfill",
                                         json=body | {"overlap": bad}), 422, "overlap")["detail"]
            assert "'bufferAll'" in detail
    rng = ["--from", start, "--to", end]
    out = as_json(redis_url, "jobs", "backfill", job.id, *rng, "--overlap", "bufferOne",
                  "--dry-run")
    assert (out["overlap"], out["counts"]["buffered"], out["counts"]["skipped"]) == (
        "bufferOne", 1, 1)
    refused = run_main(redis_url, "jobs", "backfill", job.id, *rng, "--overlap", "sometimes")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: --overlap: must be 'allow'")
    real = json.loads(rsched(redis_url, "jobs", "backfill", job.id, *rng, "--json").stdout)
    assert (real["overlap"], real["counts"]["queued"], real["counts"]["buffered"]) == (
        "bufferAll", 1, 2)
