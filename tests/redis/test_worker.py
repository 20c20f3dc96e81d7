"""Workers against a real redis-server: results and history, retries with backoff, dead letters
and replay, timeouts, missing handlers, fencing of stale reports, heartbeats and reclaims, and
pause/cancel around a run in progress.

A Rig steps a real Dispatcher and Worker (claim, fetch, finish); the dispatcher's clock is
injected, the worker's scripts use Redis's own clock, so retry times are read back from Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from support.helpers import (
    ManualClock,
    Rig,
    all_jobs,
    event_types,
    events,
    hgetall,
    next_ms,
    record_script_calls,
    redis_now_ms,
    snapshot,
    stats,
    summary,
    xrange,
)

from rsched import App, Client, Conflict, Job, JobContext, JobSpec, JobStatus, RunState
from rsched.core.layout import OWN, J
from rsched.core.retry import backoff_ceiling_ms
from rsched.engine.worker import Worker
from rsched.rdb import keys, scripts

MINUTE = 60_000


def retry_score(r: redis.Redis, p: int, run_id: str) -> int:
    score = r.zscore(keys.retry(p), run_id)
    assert score is not None, f"{run_id} has no retry scheduled"
    return int(score)


def pending(r: redis.Redis, p: int, queue: str = "default") -> list[dict[str, Any]]:
    return r.xpending_range(keys.stream(p, queue), keys.GROUP, "-", "+", 100)



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


def run_a_one_off_once(redis_url: str, client: Client, clock: ManualClock) -> tuple[Job, str]:
    """A one-off job of a handler returning None, run once; the job and its own run's id."""
    app = App()

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        return None

    job = client.schedule("t", run_at=clock() - 1)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            assert (await rig.cycle())[1:] == (1, 1)

    asyncio.run(scenario())
    return job, f"{job.id}@{job.next_ms}"

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


# --- heartbeats, reclaims and fencing ----------------------------------------------------------


def fast_reclaim(visibility_ms: int) -> dict[str, int]:
    return {"visibility_ms": visibility_ms, "heartbeat_ms": visibility_ms // 3}


def gated_app() -> tuple[App, dict[str, asyncio.Event]]:
    """A handler that runs until the test opens its worker's gate; returns the worker id."""
    app: App = App()
    gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    @app.job("long")
    async def long(ctx: JobContext) -> str:
        await gates[ctx.worker_id].wait()
        return ctx.worker_id

    return app, gates


def long_job(client: Client, clock: ManualClock, max_attempts: int) -> tuple[Job, int, str]:
    """A due run of gated_app's handler: the job, its partition and the run id."""
    job = client.schedule("long", run_at=clock() - 1, max_attempts=max_attempts)
    return job, job.partition, f"{job.id}@{job.next_ms}"


@contextlib.asynccontextmanager
async def fetched_by_w_a(
    redis_url: str, app: App, clock: ManualClock, visibility_ms: int = 100
) -> AsyncIterator[tuple[Rig, Worker]]:
    """The due run claimed and fetched by w-a (the rig's worker), with w-b there to reclaim it;
    both with the same short visibility timeout."""
    async with Rig(redis_url, app, clock=clock, worker_id="w-a",
                   worker_kw=fast_reclaim(visibility_ms)) as rig:
        b = await rig.add_worker("w-b", **fast_reclaim(visibility_ms))
        await rig.claim()
        assert await rig.fetch() == 1
        yield rig, b


def test_heartbeats_keep_a_long_run_alive_then_a_reclaim_starts_a_new_attempt_with_a_new_fence(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    job, p, rid = long_job(client, clock, max_attempts=3)
    visibility = 300

    async def scenario() -> None:
        async with fetched_by_w_a(redis_url, app, clock, visibility) as (rig, b):
            for _ in range(4):  # 4 x 150 ms: twice the visibility timeout, kept by heartbeats
                await asyncio.sleep(visibility / 2000)
                assert await rig.worker.heartbeat_once() == 0
                assert await b.reclaim_once() == 0
            run = client.get_run(rid)
            assert (run.state, run.worker, run.fence, run.attempt) == (
                RunState.RUNNING, "w-a", 1, 1)

            await asyncio.sleep(visibility / 1000 + 0.1)  # w-a hangs: no heartbeat
            assert await b.reclaim_once() == 1
            run = client.get_run(rid)
            assert (run.state, run.worker, run.fence, run.attempt) == (
                RunState.RUNNING, "w-b", 2, 2)
            assert await rig.worker.heartbeat_once() == 1  # w-a learns it lost the run
            assert rig.worker.counts["fenced"] == 1
            assert await rig.worker.heartbeat_once() == 0  # and stops heartbeating it
            gates["w-b"].set()
            await rig.finish(worker=b)

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.SUCCEEDED and run.result == "w-b" and run.attempt == 2
    types = event_types(r, p, job.id)
    assert types[-5:] == ["abandoned", "reclaimed", "started", "fenced", "succeeded"]
    assert [(a.attempt, a.status, a.worker) for a in client.runs(job.id)] == [
        (2, "succeeded", "w-b"), (1, "abandoned", "w-a")]
    assert stats(r, p)["reclaimed"] == 1


def test_a_stale_completion_after_a_reclaim_is_rejected_logged_not_recorded_and_not_acknowledged(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, gates = gated_app()
    job, p, rid = long_job(client, clock, max_attempts=3)

    async def scenario() -> None:
        async with fetched_by_w_a(redis_url, app, clock) as (rig, b):
            await rig.worker.start_once(min_age_ms=0)  # what its start loop does after a while
            await asyncio.sleep(0.2)
            assert await b.reclaim_once() == 1
            run_before = r.hgetall(keys.run(p, rid))
            hist_before = r.lrange(keys.history(p, job.id), 0, -1)

            gates["w-a"].set()  # the old owner wakes up and reports
            assert await rig.finish() == 1

            assert rig.worker.counts["fenced"] == 1
            assert r.hgetall(keys.run(p, rid)) == run_before
            assert r.lrange(keys.history(p, job.id), 0, -1) == hist_before
            [entry] = pending(r, p)
            assert entry["consumer"] == b"w-b"  # still w-b's, unacknowledged
            gates["w-b"].set()
            await rig.finish(worker=b)

    with caplog.at_level(logging.WARNING, logger="rsched.worker"):
        asyncio.run(scenario())
    [fenced] = [e for e in events(r, p, job_id=job.id) if e["e"] == "fenced"]
    assert (fenced["w"], fenced["f"], fenced["r"]) == ("w-a", "1", rid)
    assert stats(r, p)["fenced"] == 1
    assert any("rejected" in m and rid in m for m in caplog.messages)
    run = client.get_run(rid)
    assert run.state is RunState.SUCCEEDED and run.result == "w-b"
    assert pending(r, p) == []


def test_a_long_run_gets_its_start_recorded_while_it_runs_and_a_quick_one_in_its_report(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    job = client.schedule("long", run_at=clock() - 1)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a",
                       worker_kw={"start_after_ms": 50}) as rig:
            await rig.claim()
            assert await rig.fetch() == 1
            assert client.get_run(rid).state is RunState.DISPATCHED  # handler already running
            assert await rig.worker.start_once() == 0  # younger than start_after_ms
            await asyncio.sleep(0.08)
            assert await rig.worker.start_once() == 1
            run = client.get_run(rid)
            assert (run.state, run.worker, run.fence) == (RunState.RUNNING, "w-a", 1)
            assert run.started_ms is not None and run.started_ms <= redis_now_ms(r) - 50
            gates["w-a"].set()
            assert await rig.finish() == 1

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert (run.state, run.fence, run.result) == (RunState.SUCCEEDED, 1, "w-a")
    assert event_types(r, p, job.id) == ["scheduled", "dispatched", "started", "succeeded"]


def test_an_outcome_waits_while_its_runs_start_is_under_way_and_then_carries_the_new_token(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """The handler returns while its run's start script is still under way: a flush meanwhile
    holds the outcome back (sent with fence 0 it would start the run a second time), and the
    report after the start goes with the token the start took."""
    app, gates = gated_app()
    job = client.schedule("long", run_at=clock() - 1)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"
    start_sent, start_gate = asyncio.Event(), asyncio.Event()

    async def slow_starts(rc: Any, batch: list[scripts.Call]) -> list[Any]:
        if any(c[0] == "start" for c in batch):
            start_sent.set()
            await start_gate.wait()
        return await scripts.acall_many(rc, batch)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a",
                       worker_kw={"call_many": slow_starts}) as rig:
            await rig.claim()
            assert await rig.fetch() == 1
            starting = asyncio.create_task(rig.worker.start_once(min_age_ms=0))
            await start_sent.wait()
            gates["w-a"].set()
            assert await rig.finish() == 0  # held back: its start is under way
            assert len(rig.worker.done) == 1
            start_gate.set()
            assert await starting == 1
            assert await rig.worker.flush_once() == 1

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert (run.state, run.fence, run.result) == (RunState.SUCCEEDED, 1, "w-a")
    assert event_types(r, p, job.id) == ["scheduled", "dispatched", "started", "succeeded"]


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_a_run_reclaimed_before_its_start_was_recorded_counts_the_lost_attempt(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, max_attempts: int
) -> None:
    """w-a runs a fresh entry and stalls (or dies) before recording its start: the reclaim
    records that attempt as abandoned, so a job that kills its workers at once still ends in
    the dead letters, and w-a's late report is rejected."""
    app, gates = gated_app()
    job, p, rid = long_job(client, clock, max_attempts=max_attempts)

    async def scenario() -> None:
        async with fetched_by_w_a(redis_url, app, clock) as (rig, b):
            await asyncio.sleep(0.2)
            assert await b.reclaim_once() == (1 if max_attempts > 1 else 0)
            gates["w-a"].set()
            assert await rig.finish() == 1
            assert rig.worker.counts["fenced"] == 1
            gates["w-b"].set()
            await rig.finish(worker=b)

    asyncio.run(scenario())
    run = client.get_run(rid)
    lost = [(a.attempt, a.status, a.error) for a in client.runs(job.id) if a.status == "abandoned"]
    assert lost == [(1, "abandoned", "its worker stopped before recording the start")]
    [fenced] = [e for e in events(r, p, job_id=job.id) if e["e"] == "fenced"]
    assert (fenced["w"], fenced["f"]) == ("w-a", "0")
    if max_attempts > 1:
        assert (run.state, run.worker, run.result, run.attempt, run.fence) == (
            RunState.SUCCEEDED, "w-b", "w-b", 2, 1)
        assert [e["w"] for e in events(r, p, job_id=job.id) if e["e"] == "started"] == ["w-b"]
    else:
        assert run.state is RunState.DEAD and client.get(job.id).status is JobStatus.DEAD


@pytest.mark.parametrize("path", ["start loop", "heartbeat"])
def test_a_stale_start_after_a_reclaim_is_fenced_and_the_live_attempt_is_the_one_recorded(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, path: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """w-a runs a fresh entry and stalls before recording its start; w-b reclaims it and runs
    attempt 2.  When w-a wakes, its start (from its start loop, or the one its heartbeat makes
    first) must not take the run back: before the fix it got fence 2 and attempt 3, recorded
    w-b's live attempt as abandoned and, with max_attempts=2, dead-lettered the occurrence."""
    app, gates = gated_app()
    job, p, rid = long_job(client, clock, max_attempts=2)

    async def scenario() -> None:
        async with fetched_by_w_a(redis_url, app, clock) as (rig, b):
            await asyncio.sleep(0.2)  # w-a stalls: no start, no heartbeat
            assert await b.reclaim_once() == 1
            live = client.get_run(rid)
            assert (live.state, live.worker, live.attempt) == (RunState.RUNNING, "w-b", 2)

            if path == "start loop":
                assert await rig.worker.start_once(min_age_ms=0) == 1
            else:
                assert await rig.worker.heartbeat_once() == 0
            assert rig.worker.counts["fenced"] == 1
            run = client.get_run(rid)
            assert (run.state, run.worker, run.attempt, run.fence) == (
                RunState.RUNNING, "w-b", 2, live.fence)
            [entry] = pending(r, p)
            assert entry["consumer"] == b"w-b"
            assert await b.heartbeat_once() == 0  # the live owner keeps its run

            gates["w-a"].set()  # the stale handler ends: its outcome is dropped, not sent
            await rig.finish()
            gates["w-b"].set()
            assert await rig.finish(worker=b) == 1

    with caplog.at_level(logging.WARNING, logger="rsched.worker"):
        asyncio.run(scenario())
    run = client.get_run(rid)
    assert (run.state, run.worker, run.result, run.attempt) == (
        RunState.SUCCEEDED, "w-b", "w-b", 2)
    assert [(a.attempt, a.status, a.worker) for a in client.runs(job.id)] == [
        (2, "succeeded", "w-b"), (1, "abandoned", "")]
    assert r.zcard(keys.dead(p)) == 0
    [fenced] = [e for e in events(r, p, job_id=job.id) if e["e"] == "fenced"]
    assert fenced["w"] == "w-a" and "delivered to w-b" in fenced["err"]
    assert stats(r, p)["fenced"] == 1
    assert any("start rejected" in m and rid in m for m in caplog.messages)
    assert pending(r, p) == []


def test_a_heartbeat_cannot_take_back_an_entry_another_worker_reclaimed_before_starting_it(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """XAUTOCLAIM moved w-a's entry to w-b, whose start has not landed yet: w-a's heartbeat
    (XCLAIM to itself) used to move the entry back and then see w-b's start abandon it."""
    app, gates = gated_app()
    job = client.schedule("long", run_at=clock() - 1, max_attempts=3)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a",
                       worker_kw=fast_reclaim(100)) as rig:
            await rig.claim()
            await rig.fetch()
            await rig.worker.start_once(min_age_ms=0)
            await asyncio.sleep(0.15)
            r.xautoclaim(keys.stream(p, "default"), keys.GROUP, "w-b", 100, "0-0", justid=True)
            assert await rig.worker.heartbeat_once() == 1  # lost
            assert rig.worker.counts["fenced"] == 1
            [entry] = pending(r, p)
            assert entry["consumer"] == b"w-b"
            gates["w-a"].set()
            await rig.finish()

    asyncio.run(scenario())
    [fenced] = [e for e in events(r, p, job_id=job.id) if e["e"] == "fenced"]
    assert fenced["w"] == "w-a" and "heartbeat rejected" in fenced["err"]
    assert client.get_run(rid).state is RunState.RUNNING  # w-b's to start (or reclaim again)


def test_a_trigger_whose_run_id_is_the_own_runs_creates_no_second_run(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """A trigger in the very millisecond of a one-off job's own run: same run id, and the own run
    has no hash of its own for the trigger to find, so the script checks the job's own_run."""
    job, rid = run_a_one_off_once(redis_url, client, clock)
    p = job.partition
    before = snapshot(r)
    code, status = scripts.call(
        r, "trigger", [keys.job(p, job.id), keys.run(p, rid), keys.retry(p), keys.events(p)],
        [job.id, rid, job.next_ms, clock(), 0])
    assert (int(code), status) == (0, b"completed")
    assert snapshot(r) == before


def test_a_report_that_also_records_the_start_is_a_no_op_when_applied_twice(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """redis-py retries a call whose reply was lost: the second apply of a complete call that
    started the run (fence 0) must change nothing and say 'duplicate'."""
    app = App()

    @app.job("t")
    async def handler(ctx: JobContext) -> str:
        return "done"

    job = client.schedule("t", run_at=clock() - 1)
    calls, recording = record_script_calls("complete")

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_kw={"call_many": recording}) as rig:
            assert (await rig.cycle())[1:] == (1, 1)

    asyncio.run(scenario())
    [(name, ks, args)] = calls
    assert args[8 + 2 + 1] == 0  # after one group's 2 values: fence 0, it recorded the start
    before = snapshot(r)
    assert [int(x) for x in scripts.call(r, name, ks, args)] == [0]
    assert snapshot(r) == before
    assert event_types(r, job.partition, job.id) == ["scheduled", "dispatched", "succeeded"]


def test_one_report_holds_own_and_other_runs_from_two_queues_of_a_partition(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """complete.lua groups a call's runs by stream and kind: one-off jobs' own runs (their job
    key only) and a cron job's run (run, job and history keys), from two queues of one
    partition, go in one call, and each outcome lands on its own run."""
    app = App()

    @app.job("ok")
    async def ok(ctx: JobContext) -> str:
        return ctx.job_id

    @app.job("bad")
    async def bad(ctx: JobContext) -> None:
        raise ValueError("no")

    due = clock() - 1
    specs = [JobSpec("ok", queue="a", run_at=due), JobSpec("bad", queue="b", run_at=due),
             JobSpec("ok", queue="b", cron="* * * * *"), JobSpec("ok", queue="a", run_at=due),
             JobSpec("ok", queue="b", run_at=due)]
    a1, b_bad, cron, a2, b1 = jobs = all_jobs(client.schedule_many(specs))
    assert len({j.partition for j in jobs}) == 1  # one small batch: one partition
    clock.advance(60_000)
    calls, recording = record_script_calls("complete")

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock,
                       worker_kw={"call_many": recording, "queues": ["a", "b"],
                                  "concurrency": 128}) as rig:  # 4 a stream a read
            assert (await rig.cycle())[1:] == (5, 5)

    asyncio.run(scenario())
    [(_, ks, args)] = calls
    assert args[4] == 3  # groups: own runs of a, own runs of b, the cron job's run of b
    # Kinds: a group whose runs all succeeded ('s') leaves out their outcomes and retry delays.
    assert sorted(args[9:14:2]) == ["0s", "1", "1s"]
    assert len(args) == 14 + 6 * 3 + 8 * 2
    for j in (a1, a2, b1):
        [attempt] = client.runs(j.id)
        assert (attempt.status, attempt.result) == ("succeeded", j.id)
        assert client.get(j.id).status == JobStatus.COMPLETED
    failed = client.runs(b_bad.id)[-1]  # its first attempt (a retry waits)
    assert failed.status == "failed" and (failed.error or "").startswith("ValueError: no\n")
    [ran] = client.runs(cron.id)
    assert (ran.status, ran.result) == ("succeeded", cron.id)
    assert stats(r, cron.partition)["succeeded"] == 4


def test_a_run_dispatched_before_its_job_was_cancelled_still_runs_and_is_recorded(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()
    ran: list[str] = []

    @app.job("t")
    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.run_id)

    job = client.schedule("t", run_at=clock() - 1)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.claim()
            client.cancel(job.id)  # the occurrence is already on its way to a worker
            await rig.fetch()
            assert await rig.finish() == 1

    asyncio.run(scenario())
    assert ran == [rid] and client.get_run(rid).state is RunState.SUCCEEDED
    assert client.get(job.id).status is JobStatus.CANCELLED  # cancel stays final


def test_a_run_reclaimed_after_its_last_attempt_is_dead_lettered_instead_of_restarted(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, _ = gated_app()
    job = client.schedule("long", run_at=clock() - 1, max_attempts=1)
    p, rid = job.partition, f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a") as rig:
            b = await rig.add_worker("w-b", **fast_reclaim(50))
            await rig.claim()
            await rig.fetch()
            await rig.worker.start_once(min_age_ms=0)  # as its start loop would
            await asyncio.sleep(0.1)
            assert await b.reclaim_once() == 0  # nothing to run: the attempts are used up

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert run.state is RunState.DEAD and "w-a stopped heartbeating" in (run.error or "")
    assert client.get(job.id).status is JobStatus.DEAD
    assert pending(r, p) == []


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


def test_consumers_of_dead_workers_are_pruned_unless_they_still_hold_pending_runs(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app = App()

    @app.job("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    job = client.schedule("ok", run_at=clock() - 1)
    stream = keys.stream(job.partition, "default")

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.claim()
            # A worker that died holding a run, and one that died holding nothing.
            r.xreadgroup(keys.GROUP, "w-dead-busy", {stream: ">"}, count=1)
            r.xgroup_createconsumer(stream, keys.GROUP, "w-dead-idle")
            names = {c["name"] for c in r.xinfo_consumers(stream, keys.GROUP)}
            assert {b"w-dead-busy", b"w-dead-idle"} <= names
            assert await rig.worker.prune_consumers_once(idle_ms=0) >= 1
            names = {c["name"] for c in r.xinfo_consumers(stream, keys.GROUP)}
            assert b"w-dead-busy" in names  # its run must be reclaimed first
            assert b"w-dead-idle" not in names
            # Nothing young is pruned with the production threshold.
            r.xgroup_createconsumer(stream, keys.GROUP, "w-young")
            await rig.worker.prune_consumers_once()
            names = {c["name"] for c in r.xinfo_consumers(stream, keys.GROUP)}
            assert b"w-young" in names

    asyncio.run(scenario())
