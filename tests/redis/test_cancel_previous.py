"""overlap=cancelPrevious stepped by hand (a real Dispatcher and Worker, real redis-server, an
injected clock): the next occurrence asks the active run to stop and waits for it; the worker
learns it from its heartbeat; async handlers are cancelled, sync ones see ``ctx.cancelled``; a run
waiting for a retry or reclaimed from a dead worker is cancelled without running again.  With real
processes: tests/processes/test_overlap_fleet.py."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from support.helpers import ManualClock, Rig, job_field, run_of

from rsched import App, Client, JobContext, RunState
from rsched.core.models import partition_of
from rsched.rdb import keys

MINUTE = 60_000
STOPPED = "cancelled: overlap cancelPrevious, a later occurrence replaces it"


def slow_app(log: list[str]) -> App:
    app = App("cancel")

    @app.job("async")
    async def slow_async(ctx: JobContext) -> str:
        log.append(f"start {ctx.run_id}")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            log.append(f"cancelled {ctx.run_id}")
            raise
        return "done"

    @app.job("sync")
    def slow_sync(ctx: JobContext) -> str:
        log.append(f"start {ctx.run_id}")
        deadline = time.monotonic() + 30
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        log.append(f"saw cancelled {ctx.run_id}" if ctx.cancelled else f"done {ctx.run_id}")
        return "done"

    @app.job("flaky")
    def flaky(ctx: JobContext) -> None:
        raise RuntimeError("flaky")

    return app


def cancel_previous(client: Client, kind: str, **kw: Any) -> tuple[str, int]:
    """A job of ``kind`` every minute under cancelPrevious: its id and first occurrence."""
    job = client.schedule(kind, cron="* * * * *", overlap="cancelPrevious", **kw)
    assert job.next_ms is not None
    return job.id, job.next_ms


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_the_next_occurrence_stops_the_running_one_and_starts_only_once_it_has_stopped(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, kind: str
) -> None:
    job_id, t0 = cancel_previous(client, kind)
    a, b = f"{job_id}@{t0}", f"{job_id}@{t0 + MINUTE}"
    log: list[str] = []

    async def scenario() -> None:
        async with Rig(redis_url, slow_app(log), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1
            assert await rig.fetch() == 1
            await asyncio.sleep(0.05)
            assert log == [f"start {a}"]
            assert await rig.worker.heartbeat_once() == 0  # started; nothing asked yet
            clock.ms = t0 + MINUTE
            assert (await rig.claim()).dispatched == 0  # b waits for a to stop
            assert run_of(client, b).state is RunState.BUFFERED
            assert job_field(r, job_id, "cancel") == a
            assert await rig.fetch() == 0
            assert await rig.worker.heartbeat_once() == 0  # told: a is asked to stop
            assert await rig.finish() == 1
            assert log[-1] == (f"cancelled {a}" if kind == "async" else f"saw cancelled {a}")
            stopped = run_of(client, a)
            assert (stopped.state, stopped.error) == (RunState.CANCELLED, STOPPED)
            assert job_field(r, job_id, "active") == b and job_field(r, job_id, "cancel") is None
            assert (await rig.claim()).dispatched == 1  # now b
            assert await rig.fetch() == 1
            await asyncio.sleep(0.05)
            assert log[-1] == f"start {b}"
            clock.ms = t0 + 2 * MINUTE
            await rig.claim()
            await rig.worker.heartbeat_once()
            assert await rig.finish() == 1

    asyncio.run(scenario())
    assert [a.status for a in client.runs(job_id)][:2] == ["cancelled", "cancelled"]


def test_a_run_waiting_for_its_retry_is_cancelled_at_once_and_the_next_one_runs(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = cancel_previous(client, "flaky", max_attempts=5, backoff_base_ms=3_600_000)
    a, b = f"{job_id}@{t0}", f"{job_id}@{t0 + MINUTE}"

    async def scenario() -> None:
        async with Rig(redis_url, slow_app([]), clock=clock) as rig:
            clock.ms = t0
            await rig.claim()
            assert await rig.fetch() == 1 and await rig.finish() == 1
            assert run_of(client, a).state is RunState.RETRY_WAIT  # for up to an hour
            clock.ms = t0 + MINUTE
            await rig.claim()  # b buffered; a's retry is due now
            assert (await rig.claim()).dispatched == 0  # a is cancelled, b let go
            assert run_of(client, a).state is RunState.CANCELLED
            assert (await rig.claim()).dispatched == 1
            assert run_of(client, b).state is RunState.DISPATCHED

    asyncio.run(scenario())


def test_a_run_asked_to_stop_whose_worker_died_is_cancelled_by_the_reclaim_not_run_again(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job_id, t0 = cancel_previous(client, "hold")
    a = f"{job_id}@{t0}"
    release = threading.Event()
    log: list[str] = []
    app = slow_app(log)

    @app.job("hold")
    def hold(ctx: JobContext) -> None:
        log.append(f"start {ctx.run_id}")
        release.wait(10)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock,
                       worker_kw={"visibility_ms": 100, "heartbeat_ms": 50}) as rig:
            other = await rig.add_worker("w-other", visibility_ms=100, heartbeat_ms=50)
            clock.ms = t0
            await rig.claim()
            assert await rig.fetch() == 1
            await rig.worker.start_once(min_age_ms=0)  # then it stops heartbeating: "dead"
            clock.ms = t0 + MINUTE
            await rig.claim()
            await asyncio.sleep(0.3)
            await other.reclaim_once()  # started by nobody: cancelled instead
            assert run_of(client, a).state is RunState.CANCELLED
            assert not [x for x in log if x.startswith("start") and x != f"start {a}"]
            assert (await rig.claim()).dispatched == 1  # the next occurrence
            release.set()

    asyncio.run(scenario())
    assert run_of(client, a).error == STOPPED
    # The history holds both attempts: the one its dead worker left, the one the reclaim ended.
    ended = [(x.attempt, x.status, x.error) for x in client.runs(job_id) if x.run_id == a]
    assert ended == [(2, "cancelled", STOPPED), (1, "abandoned", ended[1][2])]


def test_a_run_asked_to_stop_while_still_in_its_queue_never_starts_its_handler(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """The stop comes before the worker reads the run: the worker asks its job's record just
    before the handler would start, not waiting for its first heartbeat."""
    job_id, t0 = cancel_previous(client, "async")
    a, b = f"{job_id}@{t0}", f"{job_id}@{t0 + MINUTE}"
    log: list[str] = []

    async def scenario() -> None:
        async with Rig(redis_url, slow_app(log), clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1  # a, queued: no worker has read it
            clock.ms = t0 + MINUTE
            assert (await rig.claim()).dispatched == 0  # b waits; a is asked to stop
            assert job_field(r, job_id, "cancel") == a
            assert await rig.fetch() == 1  # a is read, and ends before its handler starts
            assert await rig.finish() == 1
            assert log == []
            stopped = run_of(client, a)
            assert (stopped.state, stopped.error) == (RunState.CANCELLED, STOPPED)
            assert (await rig.claim()).dispatched == 1  # now b, which starts
            assert await rig.fetch() == 1
            await asyncio.sleep(0.05)
            assert log == [f"start {b}"]

    asyncio.run(scenario())


def test_a_run_asked_to_stop_while_waiting_for_a_worker_slot_never_starts_its_handler(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """The worker has read the run but its one slot is taken: the heartbeat's stop reaches the
    run before its turn, and its turn ends it unrun."""
    log: list[str] = []
    app = slow_app(log)
    release, held = asyncio.Event(), asyncio.Event()

    @app.job("hold")
    async def hold(ctx: JobContext) -> None:
        held.set()
        await release.wait()

    job_id, t0 = cancel_previous(client, "async")
    a = f"{job_id}@{t0}"
    holder = client.schedule("hold", queue="first", run_at=t0)

    async def scenario() -> None:
        one_slot = {"concurrency": 1, "queues": ["first", "default"]}
        async with Rig(redis_url, app, clock=clock, worker_kw=one_slot) as rig:
            clock.ms = t0
            await rig.claim()
            # One read of both streams takes an entry of each, the holder's first: it takes the
            # one slot and a waits for it.
            streams = [keys.stream(holder.partition, "first"),
                       keys.stream(partition_of(job_id), "default")]
            assert await rig.worker.intake.fetch_once(block_ms=20, streams=streams) == 2
            await asyncio.wait_for(held.wait(), 5)
            clock.ms = t0 + MINUTE
            await rig.claim()
            assert job_field(r, job_id, "cancel") == a
            assert await rig.worker.heartbeat_once() == 0  # tells the worker: a is to stop
            release.set()
            assert await rig.finish() == 2
            assert log == []
            assert run_of(client, a).state is RunState.CANCELLED
            assert run_of(client, f"{holder.id}@{holder.next_ms}").state is RunState.SUCCEEDED

    asyncio.run(scenario())
