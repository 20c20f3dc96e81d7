"""Workers' process heartbeats against a real redis-server: a worker that stops beating for
``dead_after_ms`` has all its runs taken over at once under new fences; a live worker's runs
never are; a worker that wakes after being taken over stops those handlers and writes nothing
for them; a worker leaving with runs pending hands them over at once.

A Rig steps a real Dispatcher and Workers; the liveness rounds are driven by hand
(``liveness_once``), with the shortest dead-after the worker accepts, so the silences are real.
The process-level checks (default flags, kill -9, SIGSTOP) are in
tests/processes/test_recovery.py.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from support.helpers import ManualClock, Rig, settings, stats
from support.worker import gated_app, pending

from rsched import App, Client, RunState
from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.wire import as_text
from rsched.engine.worker import Worker
from rsched.rdb import keys

DEAD_AFTER_MS = defaults.MIN_DEAD_AFTER_MS
QUICK = {"dead_after_ms": DEAD_AFTER_MS}
RUNS = 3


def schedule_long(client: Client, clock: ManualClock, n: int) -> list[str]:
    """``n`` runs of gated_app's handler, due now (straight to their queues); their run ids."""
    jobs = [client.schedule("long", run_at=clock() - 1, max_attempts=3) for _ in range(n)]
    return [f"{j.id}@{j.next_ms}" for j in jobs]


def alive(r: redis.Redis) -> dict[str, float]:
    got: list[tuple[bytes, float]] = r.zrange(keys.alive(), 0, -1, withscores=True)  # type: ignore[assignment]
    return {as_text(k): float(s) for k, s in got}


async def fetch_all(rig: Rig, n: int) -> None:
    """Fetch until the rig's worker runs ``n`` runs (a read takes one entry a stream)."""
    got = 0
    for _ in range(20):
        got += await rig.fetch()
        if got >= n:
            break
    assert got == n


def job_hash(r: redis.Redis, client: Client, rid: str) -> dict[bytes, bytes]:
    """A one-off job's hash, where its own run's fields live."""
    job_id = rid.rsplit("@", 1)[0]
    return dict(r.hgetall(keys.job(client.get(job_id).partition, job_id)))  # type: ignore[arg-type]


def test_a_worker_that_missed_its_heartbeats_has_every_run_taken_over_at_once_and_when_it_wakes_writes_nothing(  # noqa: E501
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    rids = schedule_long(client, clock, RUNS)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a", worker_kw=QUICK) as rig:
            b = await rig.add_worker("w-b", **QUICK)
            await rig.claim()
            await fetch_all(rig, RUNS)
            await rig.worker.start_once(min_age_ms=0)  # fence 1 each
            assert await rig.worker.liveness_once() == 0
            assert await b.liveness_once() == 0  # w-a beats: nothing of it is taken
            assert set(alive(r)) == {"w-a", "w-b"}

            await asyncio.sleep(DEAD_AFTER_MS / 1000 + 0.05)  # w-a is frozen: no beat
            assert await b.liveness_once() == RUNS  # all of them, in one round
            for rid in rids:
                run = client.get_run(rid)
                assert (run.state, run.worker, run.fence, run.attempt) == (
                    RunState.RUNNING, "w-b", 2, 2)
            assert "w-a" not in alive(r)  # nothing left under its name: forgotten
            stored = {rid: job_hash(r, client, rid) for rid in rids}

            # w-a wakes: its beat finds it was silent, its run heartbeat is fenced, and its
            # handlers (still held by their gate) are cancelled, their outcomes dropped.
            assert await rig.worker.liveness_once() == 0
            assert rig.worker.counts["fenced"] == RUNS
            assert await rig.worker.wait_handlers(2) == 0
            assert await rig.worker.flush_once() == 0
            assert len(rig.worker.runs) == 0
            assert {rid: job_hash(r, client, rid) for rid in rids} == stored
            assert "w-a" in alive(r)  # alive again, with no runs

            gates["w-b"].set()
            await rig.finish(worker=b)

    asyncio.run(scenario())
    for rid in rids:
        run = client.get_run(rid)
        assert (run.state, run.result, run.attempt) == (RunState.SUCCEEDED, "w-b", 2)
        job_id = rid.rsplit("@", 1)[0]
        assert [(a.attempt, a.status, a.worker) for a in client.runs(job_id)] == [
            (2, "succeeded", "w-b"), (1, "abandoned", "w-a")]
    assert all(pending(r, p) == [] for p in range(16))
    assert sum(stats(r, q).get("reclaimed", 0) for q in range(16)) == RUNS


def test_a_live_workers_long_run_is_never_taken_over_however_idle_its_entry(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """Its run heartbeat is far apart (the default 5 s), its entry idle: its beat protects it."""
    app, gates = gated_app()
    (rid,) = schedule_long(client, clock, 1)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a", worker_kw=QUICK) as rig:
            b = await rig.add_worker("w-b", **QUICK)
            await rig.claim()
            await fetch_all(rig, 1)
            await rig.worker.start_once(min_age_ms=0)
            for _ in range(10):  # 10 x a third of dead-after: three times dead-after in all
                await rig.worker.liveness_once()
                assert await b.liveness_once() == 0
                await asyncio.sleep(DEAD_AFTER_MS / 3000)
            run = client.get_run(rid)
            assert (run.state, run.worker, run.fence, run.attempt) == (
                RunState.RUNNING, "w-a", 1, 1)
            gates["w-a"].set()
            await rig.finish()

    asyncio.run(scenario())
    assert client.get_run(rid).result == "w-a"


def test_a_worker_leaving_with_runs_pending_hands_them_over_at_once_and_one_without_leaves_no_trace(  # noqa: E501
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    (rid,) = schedule_long(client, clock, 1)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a") as rig:  # default dead-after
            b = await rig.add_worker("w-b")
            c = await rig.add_worker("w-c")
            await rig.claim()
            await fetch_all(rig, 1)
            await rig.worker.start_once(min_age_ms=0)
            for w in (rig.worker, b, c):
                assert await w.liveness_once() == 0
            await rig.worker.runner.close(0)  # past its grace: the handler is let go, unreported
            await rig.worker.membership.leave()
            assert alive(r)["w-a"] == 0  # dead now, not after its missed beats
            assert await b.liveness_once() == 1  # no wait at all
            assert client.get_run(rid).worker == "w-b"
            await c.membership.leave()
            assert "w-c" not in alive(r)
            gates["w-b"].set()
            await rig.finish(worker=b)

    asyncio.run(scenario())
    assert set(alive(r)) == {"w-b"}


def test_two_workers_taking_over_the_same_dead_worker_at_once_start_each_run_once(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    rids = schedule_long(client, clock, 6)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a", worker_kw=QUICK) as rig:
            b = await rig.add_worker("w-b", **QUICK)
            c = await rig.add_worker("w-c", **QUICK)
            await rig.claim()
            await fetch_all(rig, 6)
            await rig.worker.start_once(min_age_ms=0)
            await rig.worker.liveness_once()
            await asyncio.sleep(DEAD_AFTER_MS / 1000 + 0.05)
            took = await asyncio.gather(b.liveness_once(), c.liveness_once())
            assert sum(took) == 6
            gates["w-b"].set()
            gates["w-c"].set()
            await rig.finish(worker=b)
            await rig.finish(worker=c)

    asyncio.run(scenario())
    for rid in rids:
        run = client.get_run(rid)
        assert (run.state, run.attempt, run.fence) == (RunState.SUCCEEDED, 2, 2)
    assert sum(stats(r, q).get("fenced", 0) for q in range(16)) == 0


def test_a_dead_after_below_the_minimum_is_refused_naming_it(redis_url: str) -> None:
    with pytest.raises(ValidationError) as e:
        Worker(App("x"), settings(redis_url), dead_after_ms=DEAD_AFTER_MS - 1)
    assert e.value.field == "deadAfter"
