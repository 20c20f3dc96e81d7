"""Overlap policies decided in lua/claim.lua against the job's active-run record, stepped by hand
(a real Dispatcher and Worker, real redis-server, an injected clock), and the record's release
when the active run is dead-lettered or its job cancelled.  The multi-process behaviour is in
tests/processes/test_overlap_fleet.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.helpers import ManualClock, Rig, job_field, problem_of, run_of, settings

from rsched import App, Client, Job, JobContext, RunState
from rsched.api.app import create_app
from rsched.core import defaults
from rsched.core.errors import Conflict, ValidationError
from rsched.core.models import partition_of
from rsched.rdb import keys
from rsched.service.shapes import run_json

MINUTE = 60_000


def failing_app() -> App:
    app = App("overlap")

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    @app.job("ok")
    def ok(ctx: JobContext) -> None:
        return None

    return app


def every_minute(client: Client, jtype: str, overlap: str, **options: Any) -> tuple[str, int]:
    """A job of ``jtype`` every minute under ``overlap``: its id and its first occurrence."""
    job = client.schedule(jtype, cron="* * * * *", overlap=overlap,
                          **options)
    assert job.next_ms is not None
    return job.id, job.next_ms




def test_a_claim_lets_go_of_an_active_run_whose_hash_is_gone_and_runs_the_next_occurrence(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "ok", "skip")
    a, b = (f"{job_id}@{t0 + k * MINUTE}" for k in range(2))
    p = partition_of(job_id)

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1
            assert job_field(r, job_id, "active") == a
            r.delete(keys.run(p, a))  # gone by a way no script covers: the record stays
            clock.ms = t0 + MINUTE
            assert (await rig.claim()).dispatched == 1  # healed: b runs
            assert job_field(r, job_id, "active") == b
            assert run_of(client, b).state is RunState.DISPATCHED
            assert r.hget(keys.stats(p), "overlap_healed") == b"1"

    asyncio.run(scenario())


def test_a_claim_lets_go_of_an_ended_active_run_and_its_buffered_run_takes_its_place(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "ok", "bufferOne")
    a, b, c, d = (f"{job_id}@{t0 + k * MINUTE}" for k in range(4))
    p = partition_of(job_id)

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1  # a
            clock.ms = t0 + MINUTE
            await rig.claim()
            assert run_of(client, b).state is RunState.BUFFERED
            # a ends without letting go of the record (a way no script covers), out of its queue.
            r.xdel(keys.stream(p, defaults.QUEUE), r.hget(keys.run(p, a), "stream_id") or b"")
            r.hset(keys.run(p, a), mapping={"state": "dead", "ended_ms": t0 + 1})
            clock.ms = t0 + 2 * MINUTE
            await rig.claim()  # healed: b is let go as a's end would have, c buffered behind it
            assert job_field(r, job_id, "active") == b
            assert job_field(r, job_id, "buffered") == c
            assert run_of(client, c).state is RunState.BUFFERED
            assert (await rig.claim()).dispatched == 1  # b, through the retry set
            assert run_of(client, b).state is RunState.DISPATCHED
            assert await rig.fetch() == 1 and await rig.finish() == 1  # b succeeds: c active
            assert (await rig.claim()).dispatched == 1
            assert await rig.fetch() == 1 and await rig.finish() == 1  # c succeeds
            assert job_field(r, job_id, "active") is None
            clock.ms = t0 + 3 * MINUTE
            assert (await rig.claim()).dispatched == 1  # the next occurrence runs
            assert job_field(r, job_id, "active") == d

    asyncio.run(scenario())


def test_buffer_one_holds_one_occurrence_skips_the_next_and_a_dead_letter_lets_it_go(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "boom", "bufferOne", max_attempts=1)
    a, b, c, d = (f"{job_id}@{t0 + k * MINUTE}" for k in range(4))

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1  # a: nothing active
            assert job_field(r, job_id, "active") == a
            clock.ms = t0 + MINUTE
            assert (await rig.claim()).dispatched == 0  # b waits: a is still queued
            assert run_of(client, b).state is RunState.BUFFERED
            clock.ms = t0 + 2 * MINUTE
            assert (await rig.claim()).skipped == 1  # c: a is active and b waits already
            skipped = run_of(client, c)
            assert skipped.state is RunState.SKIPPED and skipped.attempt == 0
            assert skipped.error == f"overlap: run {a} of this job is still active and {b} " \
                                    "waits already"
            assert await rig.fetch() == 1 and await rig.finish() == 1  # a dead-letters
            assert run_of(client, a).state is RunState.DEAD
            assert job_field(r, job_id, "active") == b  # released: b is the active run now
            claimed = await rig.claim()  # b, through the retry set, as its attempt 1
            assert claimed.dispatched == 1
            assert (run_of(client, b).state, run_of(client, b).attempt) == (
                RunState.DISPATCHED, 1)
            assert await rig.fetch() == 1 and await rig.finish() == 1  # b dead-letters too
            assert job_field(r, job_id, "active") is None
            clock.ms = t0 + 3 * MINUTE
            assert (await rig.claim()).dispatched == 1  # d runs: nothing is active
            assert job_field(r, job_id, "active") == d

    asyncio.run(scenario())


def test_skip_records_the_occurrence_and_a_success_or_a_cancel_releases_the_record(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "ok", "skip")

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1
            clock.ms = t0 + MINUTE
            assert (await rig.claim()).skipped == 1
            assert run_of(client, f"{job_id}@{t0 + MINUTE}").state is RunState.SKIPPED
            assert await rig.fetch() == 1 and await rig.finish() == 1  # succeeds: released
            assert job_field(r, job_id, "active") is None
            clock.ms = t0 + 2 * MINUTE
            assert (await rig.claim()).dispatched == 1
            client.cancel(job_id)  # the run in progress finishes, and lets go of the record
            assert await rig.fetch() == 1 and await rig.finish() == 1
            assert job_field(r, job_id, "active") is None

    asyncio.run(scenario())


def test_allow_jobs_and_one_off_jobs_keep_no_active_run_record(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    cron: Job = client.schedule("ok", cron="* * * * *")
    once = client.schedule("ok")
    assert cron.overlap.value == "allow"
    client.pause(cron.id)
    cron = client.resume(cron.id)  # two changes: version 3
    assert cron.next_ms is not None and cron.version == 3

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            clock.ms = cron.next_ms or 0
            assert (await rig.claim()).dispatched == 1  # once went to its queue when scheduled
            clock.ms += MINUTE
            assert (await rig.claim()).dispatched == 1  # the previous one is still queued

    asyncio.run(scenario())
    assert job_field(r, cron.id, "active") is None and job_field(r, once.id, "active") is None
    run = run_of(client, f"{cron.id}@{cron.next_ms}")
    assert run.job_version == 3  # the version it was dispatched at
    assert run_json(run)["jobVersion"] == 3


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"cron": "* * * * *", "overlap": "cancelprevious"}, "must be 'allow', 'skip', "),
        ({"cron": "* * * * *", "overlap": "Skip"}, "must be 'allow', 'skip', "),
        ({"overlap": "skip"}, "applies to recurring jobs only"),
    ],
)
def test_bad_overlap_values_name_the_overlap_field(
    client: Client, options: dict[str, str], reason: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        client.schedule("ok", **options)
    assert caught.value.field == "overlap" and caught.value.reason.startswith(reason)


def test_patch_changes_a_jobs_schedule_policy_at_its_version_and_names_a_bad_field(
    redis_url: str
) -> None:
    with TestClient(create_app(settings(redis_url), auth=False)) as api:
        job = api.post("/jobs", json={"type": "ok", "cron": "* * * * *"}).json()
        res = api.patch(f"/jobs/{job['id']}", json={
            "overlap": "cancelPrevious", "misfire": "skip", "catchUpWindowSeconds": 5},
            headers={"If-Match": "1"})
        assert res.status_code == 200, res.text
        got = res.json()
        assert (got["overlap"], got["misfire"], got["catchUpWindowSeconds"], got["version"]) == (
            "cancelPrevious", "skip", 5, 2)
        assert api.patch(f"/jobs/{job['id']}", json={"overlap": "skip"},
                         headers={"If-Match": "1"}).status_code == 412
        problem_of(api.patch(f"/jobs/{job['id']}", json={"overlap": "never"}), 422, "overlap")
        problem_of(api.patch(f"/jobs/{job['id']}", json={"catchUpWindowSeconds": -1}), 422,
                   "catchUpWindowSeconds")
        once = api.post("/jobs", json={"type": "ok", "runAt": "2030-01-01T00:00:00Z"}).json()
        problem_of(api.patch(f"/jobs/{once['id']}", json={"overlap": "skip"}), 422, "overlap")


async def dead_letter_then_run_the_next(rig: Rig, clock: ManualClock, t0: int) -> None:
    """A failing job's occurrence at t0 dead-letters; the next one is dispatched, still queued."""
    clock.ms = t0
    assert (await rig.claim()).dispatched == 1
    assert await rig.fetch() == 1 and await rig.finish() == 1
    clock.ms = t0 + MINUTE
    assert (await rig.claim()).dispatched == 1


def test_a_replayed_dead_letter_of_a_skip_job_waits_for_no_active_run_then_becomes_it(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "boom", "skip", max_attempts=1)
    a, b, c = (f"{job_id}@{t0 + k * MINUTE}" for k in range(3))

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            await dead_letter_then_run_the_next(rig, clock, t0)
            with pytest.raises(Conflict, match=f"overlap: run {b} of this job is still active"):
                client.replay(a)
            assert run_of(client, a).state is RunState.DEAD  # still a dead letter
            assert await rig.fetch() == 1 and await rig.finish() == 1  # b dead-letters
            assert client.replay(a).state is RunState.RETRY_WAIT
            assert job_field(r, job_id, "active") == a
            clock.ms = t0 + 2 * MINUTE
            claimed = await rig.claim()  # a runs; c is skipped: a is the active run
            assert (claimed.dispatched, claimed.skipped) == (1, 1)
            assert run_of(client, c).error == f"overlap: run {a} of this job is still active"
            assert await rig.fetch() == 1 and await rig.finish() == 1  # a dead-letters again
            assert job_field(r, job_id, "active") is None

    asyncio.run(scenario())


def test_a_replayed_dead_letter_of_a_buffer_one_job_is_buffered_behind_the_active_run(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = every_minute(client, "boom", "bufferOne", max_attempts=1)
    a, b = (f"{job_id}@{t0 + k * MINUTE}" for k in range(2))

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            await dead_letter_then_run_the_next(rig, clock, t0)
            assert client.replay(a).state is RunState.BUFFERED
            assert client.replay(a).state is RunState.BUFFERED  # again: nothing more
            assert job_field(r, job_id, "buffered") == a
            assert (await rig.claim()).dispatched == 0  # a waits for b
            assert await rig.fetch() == 1 and await rig.finish() == 1  # b ends: a is let go
            assert job_field(r, job_id, "active") == a
            assert (await rig.claim()).dispatched == 1
            assert (run_of(client, a).state, run_of(client, a).attempt) == (
                RunState.DISPATCHED, 1)

    asyncio.run(scenario())
