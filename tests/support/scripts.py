"""One scenario that calls every Lua script through the real client, lease keeper, claimer and
workers (``exercise_every_script``), and ``scripts_run``, which names the scripts a MONITOR saw
run: the key-discipline tests run it on one Redis (tests/redis/test_scripts.py) and on a
cluster (tests/processes/test_scripts_cluster.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ResponseError

from rsched import App, Client, Dedup, JobContext, JobSpec, JobStatus, RunState
from rsched.client import JobPatch
from rsched.core.settings import Settings
from rsched.engine.dispatcher import LeaseKeeper
from rsched.engine.dispatcher.claimer import Claimer
from rsched.engine.dispatcher.trimmer import StreamTrimmer
from rsched.engine.worker.worker import Worker
from rsched.rdb import keys, scripts, worker_registry
from rsched.rdb.queue_limits import GIVE, TAKE, PermitOp, op_permit, op_wake
from rsched.service.dead_letters import DeadFilter, op_delete
from rsched.service.listings import op_dead_letter_page
from rsched.service.operations import (
    op_cancel_operation,
    op_get_operation,
    op_run,
    op_start_purge,
)
from support.helpers import (
    PARTITIONS,
    ManualClock,
    MonitoredCommand,
    all_jobs,
    keys_in_partition,
)

# Two partitions whose slots (p0: 14, p3: 12302, see keys.tag) fall to different masters of a
# 3-master cluster: Redis 7.0 rejects a script's access to a key on another node, not yet to another
# slot of the same node, so only a cross-node layout makes the cluster test able to fail.
PA, PB = 0, 3


def scenario_app() -> tuple[App, asyncio.Event]:
    app, gate = App("scenario"), asyncio.Event()

    @app.job("ok")
    async def ok(ctx: JobContext) -> str:
        return "ok"

    @app.job("bad")
    async def bad(ctx: JobContext) -> None:
        raise RuntimeError(f"bad attempt {ctx.attempt}")

    @app.job("tick")
    def tick(ctx: JobContext) -> int:
        return ctx.scheduled_ms

    @app.job("long")
    async def long(ctx: JobContext) -> str:
        await gate.wait()
        return ctx.worker_id

    return app, gate


async def scenario_worker(
    app: App, s: Settings, ar: Any, worker_id: str, parts: tuple[int, ...], **kw: Any
) -> Worker:
    """A worker on some partitions, through the given (maybe cluster) client: one XREADGROUP
    may not span slots on a cluster, so each fetching worker reads a single partition."""
    w = Worker(app, s, worker_id=worker_id, **kw)
    await w.link.r.aclose()  # every part talks through the link: replace its client there
    w.link.r = ar
    w.link.streams = {keys.stream(p, "default"): (p, "default") for p in parts}
    for stream in w.link.streams:
        try:
            await ar.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        except ResponseError as e:
            assert "BUSYGROUP" in str(e)
    return w


async def until_done(w: Worker, n: int) -> None:
    for _ in range(500):
        if len(w.reporter.done) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{w.id}: {len(w.reporter.done)} of {n} runs finished")


async def exercise_every_script(client: Client, ar: Any, clock: ManualClock) -> None:
    """Schedule, lease, claim, start, heartbeat, complete (success, retry, dead letter, fenced),
    reclaim, a run set aside by a worker without its handler and taken by one with it (park),
    replay, delete_dead, trigger, update, pause, resume, cancel, a limit set and deleted, a
    limited run that waits and is admitted, its key read busy, a run held by a queue limit and
    woken, the events streams trimmed, and release, on two partitions."""
    app, gate = scenario_app()
    s = client.settings
    ka, kb = keys_in_partition(PA, 3, "a"), keys_in_partition(PB, 2, "b")
    now = client.now_ms()
    jobs = all_jobs(client.schedule_many([
        JobSpec("ok", run_at=now - 1, idempotency_key=ka[0], start_deadline_ms=600_000),
        JobSpec("bad", run_at=now - 1, idempotency_key=ka[1], max_attempts=2, backoff_base_ms=0),
        # Due by the claim's clock only (ok and bad, due now, go straight to their queue)
        JobSpec("long", run_at=now + 60_000, idempotency_key=kb[0], max_attempts=3),
        JobSpec("tick", cron="* * * * *", idempotency_key=kb[1]),
    ]))
    ok, bad, long, tick = jobs
    assert tick.next_ms is not None and long.next_ms is not None
    clock.ms = long.next_ms  # tick's next occurrence is due, only that one
    leases = LeaseKeeper(ar, "d1", PARTITIONS, 10_000, clock)
    claimer = Claimer(ar, "d1", clock=clock)
    wa = await scenario_worker(app, s, ar, "wa", (PA,))
    wb = await scenario_worker(app, s, ar, "wb", (PB,))
    w2 = await scenario_worker(app, s, ar, "w2", (PA, PB), visibility_ms=0, heartbeat_ms=0)
    wx = await scenario_worker(App("bare"), s, ar, "wx", (PA,))  # no handlers at all
    try:
        owned = await leases.run_once()
        assert len(owned) == PARTITIONS
        assert (await claimer.run_once(owned)).dispatched == 2  # long, tick
        assert await wa.fetch_once(block_ms=1) == 2  # ok, bad
        assert await wb.fetch_once(block_ms=1) == 2  # long, tick
        await until_done(wa, 2)
        await until_done(wb, 1)
        assert await wa.flush_once() + await wb.flush_once() == 3
        assert await wb.heartbeat_once() == 0
        assert await wb.liveness.beat() == {}  # the process heartbeat (alive): nobody dead

        (aside,) = all_jobs(client.schedule_many([
            JobSpec("ok", run_at=client.now_ms() - 1, idempotency_key=ka[2])]))
        assert await wx.fetch_once(block_ms=1) == 0  # read, and set aside: not for wx
        await wx.handback.settle()
        assert await wa.adopt_once() == 1
        await until_done(wa, 1)
        assert await wa.flush_once() == 1

        assert (await claimer.run_once(owned)).dispatched == 1  # bad's retry
        assert await wa.fetch_once(block_ms=1) == 1
        await until_done(wa, 1)
        await wa.flush_once()  # bad dead-lettered
        await worker_registry.mark_dead(ar, "wb")  # as if wb left with long still pending
        assert await w2.liveness_once() == 1  # long, taken over at once (take_over)
        gate.set()
        await until_done(wb, 1)
        await until_done(w2, 1)
        await wb.flush_once()  # fenced: w2 owns the run now
        await w2.flush_once()

        bad_run = f"{bad.id}@{bad.next_ms}"
        assert client.get_run(bad_run).state is RunState.DEAD
        page = client.run(op_dead_letter_page(client, 1))  # dead_page, then after a cursor
        assert [d.run.id for d in page.items] == [bad_run]
        assert client.run(op_dead_letter_page(client, 1, page.next_cursor)).items == []
        count = client.run(op_start_purge(client, DeadFilter(), True, "test"))  # dry run
        client.run(op_run(client, count.id, "runner"))
        assert client.run(op_get_operation(count.id)).matched == 1
        purge = client.run(op_start_purge(client, DeadFilter(), False, "test"))
        client.run(op_cancel_operation(purge.id, "test"))
        client.replay(bad_run)
        assert client.run(op_delete(client, [bad_run], "test")) == [False]  # replayed: kept
        client.trigger(tick.id)
        created = client.get(tick.id).created_ms
        assert len(client.backfill(tick.id, created - 180_000, created,
                                   overlap="allow").queued) >= 2
        # bufferAll: a chain behind the job's active run, and a second one behind its tail.
        assert len(client.backfill(tick.id, created - 360_000, created - 180_000).buffered) >= 2
        assert len(client.backfill(tick.id, created - 540_000, created - 360_000).buffered) >= 2
        client.update(tick.id, JobPatch(priority=5))
        client.pause(tick.id)
        client.resume(tick.id)
        client.cancel(tick.id)
        clock.ms = max(clock(), client.now_ms() + 1)
        claimed = await claimer.run_once(await leases.run_once())
        assert claimed.dispatched == 1  # the replay; the trigger's and backfill's runs are
        # abandoned (cancelled)

        # A limit of 1 on a key of PB: the second of its jobs waits, the first's end admits it.
        (lk,) = keys_in_partition(PB, 1, "lim-")
        client.set_limit(lk, concurrency=1)
        at = client.now_ms()
        all_jobs(client.schedule_many([JobSpec("ok", run_at=at - 2, limit_key=lk),
                                       JobSpec("ok", run_at=at - 1, limit_key=lk)]))
        clock.ms = max(clock(), client.now_ms() + 1)
        owned = await leases.run_once()
        assert (await claimer.run_once(owned)).dispatched == 1
        assert await wb.fetch_once(block_ms=1) == 1
        await until_done(wb, 1)
        assert await wb.flush_once() == 1  # frees the slot: the second is due now
        clock.ms = max(clock(), client.now_ms() + 1)
        assert (await claimer.run_once(owned)).dispatched == 1
        # limit_keys: the key is busy (the second run holds its slot), counted under its name.
        busy = client.get_limit(lk).busiest
        assert [(k.key, k.name, k.in_flight, k.waiting) for k in busy] == [(lk, lk, 1, 0)]
        client.delete_limit(lk)

        # A queue limit of 1 (queue_permit), its permit held elsewhere: the run fetched is
        # held (complete 'held'); the permit given back is reserved for it and wakes it
        # (queue_wake), and it runs, its attempt unspent.
        assert await wb.fetch_once(block_ms=1) == 1  # the key's second run, admitted above
        await until_done(wb, 1)
        assert await wb.flush_once() == 1
        client.set_queue_limit("default", concurrency=1)
        assert await wb.refresh_limits_once() == 1
        other = [PermitOp(TAKE, "other@1", "wz", PB)]
        assert client.run(op_permit("default", other, 60_000)).results == [0]
        at = client.now_ms() + 60_000  # due by the claim's clock only: claimed, not sent at once
        (held,) = all_jobs(client.schedule_many([
            JobSpec("ok", run_at=at, idempotency_key=keys_in_partition(PB, 1, "queue-")[0])]))
        held_run = f"{held.id}@{held.next_ms}"
        clock.ms = max(clock(), at + 1)
        assert (await claimer.run_once(owned)).dispatched == 1
        assert await wb.fetch_once(block_ms=1) == 1
        await until_done(wb, 1)
        assert await wb.flush_once() == 1
        assert client.get_run(held_run).state is RunState.WAITING
        given = client.run(op_permit("default", [other[0]._replace(op=GIVE)], 60_000))
        assert given.wake == [(PB, held_run)]
        assert client.run(op_wake(given.wake)) == 1
        clock.ms = max(clock(), client.now_ms() + 1)
        assert (await claimer.run_once(owned)).dispatched == 1
        assert await wb.fetch_once(block_ms=1) == 1
        await until_done(wb, 1)
        assert await wb.flush_once() == 1
        run = client.get_run(held_run)
        assert (run.state, run.attempt) == (RunState.SUCCEEDED, 1)
        client.delete_queue_limit("default")
        trimmed = await StreamTrimmer(ar, 5, 0, clock).run_once(owned)  # no archiver: to 5
        assert (trimmed.bounded, trimmed.read) == (PARTITIONS, 0)
        await leases.release_all()
    finally:
        for w in (wa, wb, w2, wx):  # each closes the shared client too: the scenario is over
            await w.close(wait_s=1)

    assert client.get_run(f"{ok.id}@{ok.next_ms}").result == "ok"
    aside_run = client.get_run(f"{aside.id}@{aside.next_ms}")
    assert (aside_run.result, aside_run.attempt, aside_run.worker) == ("ok", 1, "wa")
    long_run = client.get_run(f"{long.id}@{long.next_ms}")
    assert (long_run.state, long_run.result, long_run.fence) == (RunState.SUCCEEDED, "w2", 2)
    assert client.get_run(bad_run).state is RunState.DISPATCHED
    assert client.get(tick.id).status is JobStatus.CANCELLED
    assert int(client.r.hget(keys.stats(PB), "fenced") or 0) == 1
    exercise_dedup(client)


def exercise_dedup(client: Client) -> None:
    """Schedule's dedup windows: each mode answered by a job of its own call and, in a second
    call, by the job its record names (the call sent again with that job's key); untilDone
    after its job ended, and with an idempotency key."""
    for mode in ("ttl", "untilDone", "debounce"):
        d = Dedup(f"scenario-{mode}", 60_000, mode)
        first, again = all_jobs(client.schedule_many([JobSpec("ok", 1, dedup=d)] * 2))
        later = client.schedule("ok", 2, dedup=d)
        assert first.id == again.id == later.id and later.deduplicated
    held = client.schedule("ok", dedup=Dedup("scenario-untilDone", 60_000, "untilDone"))
    client.cancel(held.id)
    fresh = client.schedule("ok", dedup=Dedup("scenario-untilDone", 60_000, "untilDone"),
                            idempotency_key="scenario-dedup")
    assert fresh.id != held.id and not fresh.deduplicated


def scripts_run(commands: Iterable[MonitoredCommand]) -> set[str]:
    """The rsched scripts the commands called (to prove a scenario ran them all)."""
    return {SCRIPT_OF_SHA[c.args[1]] for c in commands
            if c.args[0] == b"EVALSHA" and c.args[1] in SCRIPT_OF_SHA}


SCRIPT_OF_SHA = {scripts.load(name).sha.encode(): name for name in scripts.NAMES}
