"""Workers against a real redis-server: heartbeats, reclaims and fencing.  A run whose worker
stops heartbeating is reclaimed with a new fence; stale starts, completions and heartbeats are
refused; reports are idempotent; consumers of dead workers are pruned.

A Rig steps a real Dispatcher and Worker (claim, fetch, finish); the dispatcher's clock is
injected, the worker's scripts use Redis's own clock, so retry times are read back from Redis.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
from support.helpers import (
    ManualClock,
    Rig,
    all_jobs,
    event_types,
    events,
    record_script_calls,
    redis_now_ms,
    snapshot,
    stats,
)
from support.worker import (
    fast_reclaim,
    fetched_by_w_a,
    gated_app,
    long_job,
    pending,
    run_a_one_off_once,
)

from rsched import App, Client, JobContext, JobSpec, JobStatus, RunState
from rsched.rdb import keys, scripts

# --- heartbeats, reclaims and fencing ----------------------------------------------------------


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
