"""Workers against a real redis-server: a run in progress while its job is paused, cancelled or
triggered, and triggers of one-off jobs before their time.

A Rig steps a real Dispatcher and Worker (claim, fetch, finish); the dispatcher's clock is
injected, the worker's scripts use Redis's own clock, so retry times are read back from Redis.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from support.helpers import (
    ManualClock,
    Rig,
    event_types,
    next_ms,
    xrange,
)
from support.worker import (
    MINUTE,
    gated_app,
    retry_score,
)

from rsched import App, Client, Conflict, JobContext, JobStatus, RunState
from rsched.rdb import keys

# --- pause and cancel around a run in progress --------------------------------------------------


@pytest.mark.parametrize("control", ["pause", "cancel"])
def test_pausing_or_cancelling_a_recurring_job_lets_the_run_in_progress_finish_and_stops_later_runs(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, control: str
) -> None:
    app, gates = gated_app()
    job = client.schedule("long", cron="* * * * *")
    assert job.next_ms is not None
    p, rid = job.partition, f"{job.id}@{job.next_ms}"
    clock.ms = job.next_ms

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.claim()
            assert await rig.fetch() == 1
            getattr(client, control)(job.id)
            gates["w-test"].set()
            assert await rig.finish() == 1
            for n in range(1, 4):
                clock.ms = next_ms(job) + n * MINUTE
                assert (await rig.claim()).dispatched == 0

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.SUCCEEDED and run.result == "w-test"
    expected = JobStatus.PAUSED if control == "pause" else JobStatus.CANCELLED
    assert client.get(job.id).status is expected
    assert r.zscore(keys.due(p), job.id) is None
    assert len(xrange(r, keys.stream(p, "default"))) <= 1


def test_cancelling_a_job_abandons_its_pending_retry(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()

    @app.job("flaky")
    async def flaky(ctx: JobContext) -> None:
        raise RuntimeError("no")

    job = client.schedule("flaky", run_at=clock() - 1, max_attempts=5, backoff_base_ms=0)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.cycle()
            assert client.get_run(rid).state is RunState.RETRY_WAIT
            client.cancel(job.id)
            clock.ms = max(clock(), retry_score(r, p, rid))
            claimed, started, _ = await rig.cycle()
            assert (claimed.dispatched, started) == (0, 0)

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.ABANDONED and run.error == "job cancelled"
    assert r.zcard(keys.retry(p)) == 0
    assert event_types(r, p, job.id)[-2:] == ["cancelled", "abandoned"]
    with pytest.raises(Conflict, match="abandoned, not dead-lettered"):
        client.replay(rid)


def test_a_one_off_job_paused_while_its_run_is_in_progress_ends_completed_not_stuck_paused(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    job = client.schedule("long", run_at=clock() - 1)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.claim()
            assert await rig.fetch() == 1
            assert client.pause(job.id).status is JobStatus.PAUSED
            gates["w-test"].set()
            assert await rig.finish() == 1

    asyncio.run(scenario())
    assert client.get_run(rid).result == "w-test"
    assert client.get(job.id).status is JobStatus.COMPLETED  # nothing is left to resume
    with pytest.raises(Conflict):
        client.resume(job.id)


# --- triggers ----------------------------------------------------------------------------------


def test_triggering_a_one_off_job_before_its_time_runs_it_now_and_again_at_its_time(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()

    @app.job("report")
    async def report(ctx: JobContext) -> int:
        return ctx.scheduled_ms

    job = client.schedule("report", run_at=clock() + MINUTE)
    p = job.partition

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            rid = client.trigger(job.id)
            clock.ms = max(clock(), retry_score(r, p, rid))
            assert (await rig.cycle())[1:] == (1, 1)
            assert client.get_run(rid).state is RunState.SUCCEEDED
            assert client.get(job.id).status is JobStatus.SCHEDULED  # its own run is still due
            clock.ms = job.next_ms or 0
            claimed, started, _ = await rig.cycle()
            assert (claimed.dispatched, started) == (1, 1)
            assert claimed.earliest_ms is None  # nothing left: the dispatcher may sleep

    asyncio.run(scenario())
    assert client.get_run(f"{job.id}@{job.next_ms}").state is RunState.SUCCEEDED
    assert client.get(job.id).status is JobStatus.COMPLETED
    assert r.zcard(keys.due(p)) == 0
