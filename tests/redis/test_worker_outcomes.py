"""Workers against a real redis-server: what a run leaves behind.  Results and history, retries
with backoff, dead letters and replay, timeouts, retention, and runs without a handler here.

A Rig steps a real Dispatcher and Worker (claim, fetch, finish); the dispatcher's clock is
injected, the worker's scripts use Redis's own clock, so retry times are read back from Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import redis
from support.helpers import (
    ManualClock,
    Rig,
    event_types,
    events,
    hgetall,
    next_ms,
    redis_now_ms,
    stats,
    summary,
)
from support.worker import (
    MINUTE,
    pending,
    retry_score,
    run_a_one_off_once,
)

from rsched import App, Client, JobContext, JobStatus, RunState
from rsched.core.layout import OWN, J
from rsched.core.retry import backoff_ceiling_ms
from rsched.engine.worker import Worker
from rsched.rdb import keys

# --- success and failure -----------------------------------------------------------------------


def test_a_successful_run_records_its_result_history_and_completes_a_one_off_job(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()

    @app.job("email")
    def send(ctx: JobContext) -> dict[str, Any]:  # sync: runs in the thread pool
        return {"sent_to": ctx.payload["to"], "attempt": ctx.attempt, "run": ctx.run_id}

    job = client.schedule("email", {"to": "a@x"}, run_at=clock() - 1)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            assert (await rig.cycle())[1:] == (1, 1)

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.SUCCEEDED and run.worker == "w-test" and run.fence == 1
    assert run.result == {"sent_to": "a@x", "attempt": 1, "run": rid}
    assert run.started_ms is not None and run.ended_ms is not None
    assert client.get(job.id).status is JobStatus.COMPLETED
    [attempt] = client.runs(job.id)
    assert (attempt.run_id, attempt.attempt, attempt.status) == (rid, 1, "succeeded")
    assert attempt.result == run.result and attempt.worker == "w-test"
    # Started and finished within one report: the outcome event carries the start.
    assert event_types(r, job.partition, job.id) == ["scheduled", "dispatched", "succeeded"]
    [done] = [e for e in events(r, job.partition, job_id=job.id) if e["e"] == "succeeded"]
    assert (int(done["st"]), int(done["f"]), done["w"]) == (run.started_ms, 1, "w-test")
    assert stats(r, job.partition)["succeeded"] == 1
    assert pending(r, job.partition) == []  # acknowledged


def test_a_one_off_job_run_once_keeps_its_run_in_a_few_short_fields_and_no_null_result(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """The memory a completed job keeps (core.layout): no last_run_id (its own run is the last),
    no result for a handler's None, and no updated_ms (it is the run's end)."""
    job, rid = run_a_one_off_once(redis_url, client, clock)
    stored = {k.decode() for k in hgetall(r, keys.job(job.partition, job.id))}
    assert stored == {J.type, J.next_ms, J.spec, J.own_run, J.status, OWN.attempt,
                      OWN.state, OWN.dispatched_ms, OWN.stream_id, OWN.worker, OWN.fence,
                      OWN.started_ms, OWN.ended_ms, OWN.duration_ms}
    run = client.get_run(rid)
    assert run.state is RunState.SUCCEEDED and run.result is None
    done = client.get(job.id)
    assert done.status is JobStatus.COMPLETED and done.last_run_id == rid
    assert run.ended_ms is not None and done.updated_ms == run.ended_ms > done.created_ms
    [attempt] = client.runs(job.id)
    assert (attempt.run_id, attempt.status, attempt.result) == (rid, "succeeded", None)


@pytest.mark.parametrize("result", [None, "done"])
@pytest.mark.parametrize("start_first", [False, True])
def test_a_one_off_jobs_own_run_stores_the_same_fields_whether_or_not_its_start_came_first(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, result: str | None,
    start_first: bool,
) -> None:
    """complete.lua writes each of these four shapes with a call of its own (no table): each
    stores the run's start, its end and the job's, and its result unless it is None."""
    app = App()
    gate = asyncio.Event()

    @app.job("t")
    async def t(ctx: JobContext) -> str | None:
        await gate.wait()
        return result

    job = client.schedule("t", run_at=clock() - 1)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_kw={"start_after_ms": 0}) as rig:
            await rig.claim()
            assert await rig.fetch() == 1
            if start_first:
                assert await rig.worker.start_once() == 1
            gate.set()
            assert await rig.finish() == 1

    asyncio.run(scenario())
    stored = {k.decode() for k in hgetall(r, keys.job(job.partition, job.id))}
    expected = {J.type, J.next_ms, J.spec, J.own_run, J.status, OWN.attempt, OWN.state,
                OWN.dispatched_ms, OWN.stream_id, OWN.worker, OWN.fence, OWN.started_ms,
                OWN.ended_ms, OWN.duration_ms}
    if start_first:
        expected.add(OWN.hb_ms)  # start.lua's first heartbeat
    assert stored == expected | ({OWN.result} if result is not None else set())
    run = client.get_run(rid)
    assert (run.state, run.result, run.worker, run.fence) == (RunState.SUCCEEDED, result,
                                                                "w-test", 1)
    assert run.started_ms is not None and run.ended_ms is not None
    assert run.started_ms <= run.ended_ms
    assert client.get(job.id).status is JobStatus.COMPLETED
    types = ["scheduled", "dispatched", "started", "succeeded"]
    assert event_types(r, job.partition, job.id) == [e for e in types
                                                     if start_first or e != "started"]


@pytest.mark.parametrize(("base_ms", "cap_ms"), [(1000, 3_600_000), (1000, 1500)])
def test_failed_attempts_are_retried_with_capped_exponential_backoff_then_dead_lettered(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock,
    caplog: pytest.LogCaptureFixture, base_ms: int, cap_ms: int,
) -> None:
    app = App()

    @app.job("flaky")
    async def flaky(ctx: JobContext) -> None:
        raise ValueError(f"boom {ctx.attempt}")

    job = client.schedule("flaky", run_at=clock() - 1, max_attempts=3,
                          backoff_base_ms=base_ms, backoff_cap_ms=cap_ms)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.claim()
            for attempt in (1, 2):
                before = redis_now_ms(r)
                assert await rig.fetch() == 1
                await rig.finish()
                after = redis_now_ms(r)
                run = client.get_run(rid)
                assert run.state is RunState.RETRY_WAIT and run.attempt == attempt
                assert summary(run.error) == f"ValueError: boom {attempt}"
                ceiling = min(base_ms * 2**attempt, cap_ms)
                assert ceiling == backoff_ceiling_ms(attempt, base_ms, cap_ms)
                assert before <= retry_score(r, p, rid) <= after + ceiling
                clock.ms = max(clock(), retry_score(r, p, rid))
                assert (await rig.claim()).dispatched == 1
            assert await rig.fetch() == 1
            await rig.finish()

    with caplog.at_level(logging.ERROR, logger="rsched.worker"):
        asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.DEAD and run.attempt == 3
    assert summary(run.error) == "ValueError: boom 3"
    assert run.error and "Traceback (most recent call last)" in run.error  # where it failed
    assert r.zscore(keys.retry(p), rid) is None and r.zscore(keys.dead(p), rid) is not None
    assert [d.id for d in client.dead_letters()] == [rid]
    assert client.get(job.id).status is JobStatus.DEAD
    s = stats(r, p)
    assert (s["failed"], s["retried"], s["dead_lettered"]) == (3, 2, 1)
    assert [a.status for a in client.runs(job.id)] == ["failed"] * 3
    assert [summary(a.error) for a in client.runs(job.id)] == [
        f"ValueError: boom {n}" for n in (3, 2, 1)]
    assert any("ALERT" in m and rid in m for m in caplog.messages)
    dead = [e for e in events(r, p, job_id=job.id) if e["e"] == "dead_lettered"]
    assert len(dead) == 1 and summary(dead[0]["err"]) == "ValueError: boom 3"


def test_a_replayed_dead_letter_starts_again_from_attempt_one_and_can_succeed(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()
    healthy = False

    @app.job("flaky")
    async def flaky(ctx: JobContext) -> str:
        if not healthy:
            raise RuntimeError("downstream is down")
        return f"ok on attempt {ctx.attempt}"

    job = client.schedule("flaky", run_at=clock() - 1, max_attempts=1)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        nonlocal healthy
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.cycle()
            assert client.get_run(rid).state is RunState.DEAD
            healthy = True
            replayed = client.replay(rid)
            assert replayed.state is RunState.RETRY_WAIT and replayed.attempt == 0
            assert client.get(job.id).status is JobStatus.SCHEDULED
            clock.ms = max(clock(), retry_score(r, p, rid))
            assert (await rig.cycle())[1:] == (1, 1)

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.SUCCEEDED and run.attempt == 1
    assert run.result == "ok on attempt 1"
    assert client.get(job.id).status is JobStatus.COMPLETED
    assert client.dead_letters() == [] and r.zcard(keys.dead(p)) == 0
    assert [a.status for a in client.runs(job.id)] == ["succeeded", "failed"]
    assert "replayed" in event_types(r, p, job.id)


def test_retrying_an_occurrence_of_a_recurring_job_does_not_move_its_next_regular_occurrence(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()

    @app.job("sync")
    async def sync(ctx: JobContext) -> None:
        raise ConnectionError("partner API unavailable")

    job = client.schedule("sync", cron="*/5 * * * *", max_attempts=3, backoff_base_ms=1000)
    assert job.next_ms is not None
    p, rid = job.partition, f"{job.id}@{job.next_ms}"
    following = job.next_ms + 5 * MINUTE
    clock.ms = job.next_ms

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            for _ in range(2):
                await rig.cycle()
                assert client.get(job.id).next_ms == following
                assert r.zscore(keys.due(p), job.id) == following
                clock.ms = max(clock(), retry_score(r, p, rid))
            assert client.get_run(rid).attempt == 2
            await rig.cycle()

    asyncio.run(scenario())
    assert client.get_run(rid).state is RunState.DEAD
    after = client.get(job.id)
    assert after.status is JobStatus.SCHEDULED  # a recurring job lives on past a dead occurrence
    assert after.next_ms == following and r.zscore(keys.due(p), job.id) == following


@pytest.mark.parametrize("flavour", ["async", "sync"])
def test_a_handler_over_its_timeout_is_cancelled_and_counts_as_a_timed_out_failure(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, flavour: str
) -> None:
    app = App()
    if flavour == "async":
        @app.job("slow")
        async def slow_async(ctx: JobContext) -> None:
            await asyncio.sleep(5)
    else:
        @app.job("slow")
        def slow_sync(ctx: JobContext) -> None:
            time.sleep(0.6)

    job = client.schedule("slow", run_at=clock() - 1, timeout_ms=100, max_attempts=2)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            t0 = time.monotonic()
            await rig.cycle()
            if flavour == "async":
                assert time.monotonic() - t0 < 0.5  # cancelled: not waited for
            else:  # a thread cannot be stopped: the outcome (and retry) waits for it
                assert time.monotonic() - t0 >= 0.6

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.RETRY_WAIT and run.error == "timed out after 0.1 s"
    [attempt] = client.runs(job.id)[1:]  # the first entry is the pending retry
    assert attempt.status == "timed_out" and attempt.error == "timed out after 0.1 s"
    assert stats(r, job.partition)["failed"] == 1
    assert "timed_out" in event_types(r, job.partition, job.id)


@pytest.mark.parametrize("ttl_ms", [60_000, 0])
def test_a_completed_one_off_job_and_its_run_expire_after_the_retention_dead_ones_stay(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, ttl_ms: int
) -> None:
    app = App()

    @app.job("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @app.job("bad")
    async def bad(ctx: JobContext) -> None:
        raise RuntimeError("no")

    done = client.schedule("ok", run_at=clock() - 1)
    dead = client.schedule("bad", run_at=clock() - 1, max_attempts=1)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock,
                       settings_overrides={"finished_ttl_ms": ttl_ms}) as rig:
            for _ in range(2):  # both jobs may share a partition: one entry per stream a read
                await rig.cycle()

    asyncio.run(scenario())
    assert client.get(done.id).status is JobStatus.COMPLETED
    assert client.get(dead.id).status is JobStatus.DEAD
    # A one-off job's own run lives in the job hash: it expires with the job, no key of its own.
    p, q = done.partition, dead.partition
    ttl = r.pttl(keys.job(p, done.id))
    assert (0 < ttl <= ttl_ms) if ttl_ms else ttl == -1, ttl
    assert r.pttl(keys.job(q, dead.id)) == -1
    for job, state in ((done, "succeeded"), (dead, "dead")):
        run_id = f"{job.id}@{job.next_ms}"
        assert not r.exists(keys.run(job.partition, run_id))
        assert client.get_run(run_id).state.value == state


def test_a_run_without_a_handler_here_is_set_aside_unrun_then_dead_lettered_after_the_wait(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """No attempt is spent on a worker without the handler: the run stays dispatched, pending
    under the type's own consumer, until the handler wait has passed with no live worker
    serving its type on its queue; then it is dead-lettered saying so (not UnknownJobType)."""
    app = App("billing")

    @app.job("invoice")
    async def invoice(ctx: JobContext) -> None: ...

    job = client.schedule("nobody-home", run_at=clock() - 1, max_attempts=2, backoff_base_ms=0)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"
    stream = keys.stream(p, "default")

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_kw={
                "handler_wait_s": 3.0, "visibility_ms": 4000, "heartbeat_ms": 1000}) as rig:
            await rig.claim()
            assert await rig.worker.fetch_once(block_ms=100) == 0  # read, not started
            await rig.worker.handback.settle()
            assert await rig.worker.reclaim_once() == 0  # not idle long enough yet
            run = client.get_run(rid)
            assert (run.state, run.attempt) == (RunState.DISPATCHED, 1)
            [entry] = r.xpending_range(stream, keys.GROUP, "-", "+", 10)
            assert entry["consumer"] == keys.parked_consumer("nobody-home").encode()
            assert "dead_lettered" not in stats(r, p)
            await asyncio.sleep(3.2)  # the handler wait: XAUTOCLAIM takes it again by then
            assert await rig.worker.reclaim_once() == 0

    asyncio.run(scenario())
    [dead] = client.dead_letters()
    assert dead.id == rid and dead.attempt == 1
    assert dead.error == "no live worker serves type nobody-home on queue default for 3 s"
    assert stats(r, p)["dead_lettered"] == 1
    assert r.xpending(stream, keys.GROUP)["pending"] == 0


def test_a_run_set_aside_and_reclaimed_by_a_worker_with_its_handler_keeps_its_attempt(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """A run set aside long enough to look idle is taken by the ordinary reclaim (XAUTOCLAIM)
    of a worker that has the handler: no worker stopped before recording its start, so no
    attempt is lost (start.lua reads the set-aside mark) and nothing is recorded abandoned."""
    has = App("has")

    @has.job("report")
    async def report(ctx: JobContext) -> str:
        return ctx.worker_id

    job = client.schedule("report", run_at=clock() - 1, max_attempts=1)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, App("lacks"), clock=clock, worker_id="wx") as rig:
            await rig.claim()
            assert await rig.worker.fetch_once(block_ms=100) == 0
            await rig.worker.handback.settle()
            wv = Worker(has, rig.settings, worker_id="wv", visibility_ms=0, heartbeat_ms=0)
            rig.workers.append(wv)
            await wv.setup()
            assert await wv.reclaim_once() == 1
            for _ in range(200):
                if wv.reporter.done:
                    break
                await asyncio.sleep(0.01)
            assert await wv.flush_once() == 1

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert (run.state, run.attempt, run.worker, run.result) == (
        RunState.SUCCEEDED, 1, "wv", "wv")
    assert [a.status for a in client.runs(job.id)] == ["succeeded"]
    assert "abandoned" not in event_types(r, job.partition)
    assert b"nh" not in r.hkeys(keys.job(job.partition, job.id))


def test_a_job_keeps_only_its_most_recent_attempts_in_redis(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()

    @app.job("tick")
    async def tick(ctx: JobContext) -> int:
        return ctx.scheduled_ms

    job = client.schedule("tick", cron="* * * * *")
    assert job.next_ms is not None

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, settings_overrides={"history_len": 3}) as rig:
            for n in range(5):
                clock.ms = next_ms(job) + n * MINUTE
                assert (await rig.cycle())[1:] == (1, 1)

    asyncio.run(scenario())
    history = client.runs(job.id)
    assert [a.result for a in history] == [job.next_ms + n * MINUTE for n in (4, 3, 2)]
    assert r.llen(keys.history(job.partition, job.id)) == 3
