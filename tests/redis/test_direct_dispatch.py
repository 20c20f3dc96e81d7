"""A one-off job scheduled due goes straight to its queue stream from the schedule script: it
runs with no dispatcher at all, and leaves the same stream entry, run fields and events as a
job the dispatcher claimed.  Jobs due later, paused or recurring ones keep the due set."""

from __future__ import annotations

import asyncio
import re

import redis
from support.helpers import (
    ManualClock,
    Rig,
    events,
    hgetall,
    keys_in_partition,
    settings,
    stats,
    stream_entries,
)

from rsched import App, Client, JobContext, JobSpec, RunState
from rsched.core.layout import JB, J
from rsched.engine.worker.worker import Worker
from rsched.rdb import keys

P = 3  # every job of these tests in one partition (idempotency keys chosen for it)


def key_for(name: str) -> str:
    """An idempotency key whose job lands in partition P."""
    return keys_in_partition(P, 1, name)[0]


def test_a_job_created_due_goes_to_its_queue_though_the_clients_clock_runs_a_little_ahead(
    client: Client,
) -> None:
    """The client estimates Redis's clock from an offset (service.context.op_now), which can run
    a millisecond or two ahead: a job created without a runAt is still due, not a due-set
    entry that waits for a dispatcher (the schedule script compares with the client's now)."""
    client.now_ms()  # the offset is measured: now skew it as a slightly wrong estimate would
    client._offset_ms += 5
    job = client.schedule("t", idempotency_key=key_for("skewed"))
    assert client.get(job.id).next_ms is None  # dispatched: its own run went to the queue
    assert client.get_run(f"{job.id}@{job.next_ms}").state is RunState.DISPATCHED
    later = client.schedule("t", run_at=client.now_ms() + 60_000, idempotency_key=key_for("l"))
    assert client.get(later.id).next_ms == later.next_ms  # still waits in the due set


def test_a_job_scheduled_due_runs_with_no_dispatcher_and_a_later_one_does_not(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    app = App("t")
    ran: list[str] = []

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        ran.append(ctx.run_id)

    now = client.now_ms()
    due, later = (client.schedule("t", run_at=at, idempotency_key=key_for(name))
                  for name, at in (("due", now - 5000), ("later", now + 60_000)))

    async def scenario() -> None:
        w = Worker(app, settings(redis_url), worker_id="w-alone")
        try:
            await w.setup()
            for _ in range(20):
                await w.fetch_once(block_ms=50)
                await w.wait_handlers(5)
                await w.flush_once()
        finally:
            await w.close()

    asyncio.run(scenario())
    assert ran == [f"{due.id}@{due.next_ms}"]
    assert client.get_run(ran[0]).state is RunState.SUCCEEDED
    assert r.zscore(keys.due(P), due.id) is None
    assert r.zscore(keys.due(P), later.id) is not None  # the dispatcher's, when it is due
    assert [e["j"] for e in stream_entries(r, P)] == [due.id]
    assert stats(r, P)["dispatched"] == 1


def test_paused_and_recurring_jobs_scheduled_due_wait_for_the_dispatcher(
    client: Client, r: redis.Redis
) -> None:
    now = client.now_ms()
    paused, tick = client.schedule_many([
        JobSpec("t", run_at=now - 1, paused=True, idempotency_key=key_for("paused")),
        JobSpec("t", cron="* * * * *", idempotency_key=key_for("tick")),
    ])
    assert r.xlen(keys.stream(P, "default")) == 0
    assert r.zscore(keys.due(P), tick.id) is not None  # type: ignore[union-attr]
    assert client.get(paused.id).last_run_id is None  # type: ignore[union-attr]


def _shape(h: dict[bytes, bytes]) -> dict[str, str]:
    """A hash with ids, times and the stream id replaced by what they are."""
    out = {}
    for k, v in h.items():
        s = v.decode(errors="replace")
        s = re.sub(r"\d{13}-\d+", "<sid>", s)
        s = re.sub(r"\d+-[\w-]{19,}(@\d+)?", "<id>", s)  # rsched.core.ids
        s = re.sub(r"\b\d{13}\b", "<ms>", s)
        out[k.decode()] = s
    return out


def test_a_job_queued_at_scheduling_looks_exactly_like_one_the_dispatcher_claimed(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    now = client.now_ms()
    direct = client.schedule("t", {"n": 1}, run_at=now - 1, idempotency_key=key_for("direct"))
    claimed = client.schedule("t", {"n": 1}, run_at=now + 1000, idempotency_key=key_for("claim"))

    async def scenario() -> None:
        clock.advance(2000)
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            assert (await rig.claim()).dispatched == 1  # only the later one: the other is queued

    asyncio.run(scenario())
    a, b = (hgetall(r, keys.job(P, j.id)) for j in (direct, claimed))
    assert set(a) == set(b)
    own = (J.spec, J.body_hash)  # run_at differs, so do these
    assert {k: v for k, v in _shape(a).items() if k not in own} == {
        k: v for k, v in _shape(b).items() if k not in own}
    ea, eb = (next(e for e in stream_entries(r, P) if e["j"] == j.id) for j in (direct, claimed))
    assert set(ea) == set(eb) and ea["o"] == eb["o"] == "1" and "a" not in ea  # 1: left out
    assert ea["r"] == a[JB.own_run].decode() == f"{direct.id}@{direct.next_ms}"
    hist = {j.id: [(e["e"], sorted(e)) for e in events(r, P, job_id=j.id)]
            for j in (direct, claimed)}
    assert hist[direct.id] == hist[claimed.id]
    assert [kind for kind, _ in hist[direct.id]] == ["scheduled", "dispatched"]
    assert stats(r, P)["dispatched"] == 2


def test_a_dispatched_own_run_is_the_jobs_last_run_without_a_field_unless_a_trigger_came_first(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """last_run_id is not stored for the own run (lua/claim.lua, lua/schedule.lua): absent, the
    own run is the last (Job.from_hash); a trigger's run before it is written over."""
    now = client.now_ms()
    direct = client.schedule("t", run_at=now - 1, idempotency_key=key_for("last-direct"))
    plain = client.schedule("t", run_at=now + 1000, idempotency_key=key_for("last-plain"))
    triggered = client.schedule("t", run_at=now + 1000, idempotency_key=key_for("last-trig"))
    trigger_run = client.trigger(triggered.id)
    assert client.get(triggered.id).last_run_id == trigger_run

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock) as rig:
            clock.advance(200)
            await rig.lease()
            assert (await rig.claim()).dispatched == 1  # the trigger's run
            assert client.get(triggered.id).last_run_id == trigger_run
            clock.advance(1800)
            await rig.lease()
            assert (await rig.claim()).dispatched == 2

    asyncio.run(scenario())
    for job in (direct, plain, triggered):
        h = hgetall(r, keys.job(P, job.id))
        own = f"{job.id}@{job.next_ms}"
        assert h[JB.own_run] == own.encode()
        assert (JB.last_run_id in h) == (job is triggered)
        assert client.get(job.id).last_run_id == own


def test_a_call_mixing_types_queues_priorities_and_states_records_each_jobs_own_events(
    client: Client, r: redis.Redis
) -> None:
    """One script call with several (type, queue) groups carries them per event, one of a single
    kind once for its entry (lua/schedule.lua): either way each job's events name its own type
    and queue.  A group with priorities sends each job's due score, one without sends none:
    both are indexed (or queued) by the score the spec asks for."""
    now = client.now_ms()
    later = now + 3_600_000
    names = keys_in_partition(P, 24, "mix")
    specs = [JobSpec(("a", "b")[i % 2], queue=("default", "bulk")[i // 2 % 2],
                     priority=(0, 0, 7)[i % 3], paused=i % 8 == 7,
                     run_at=later if i % 4 == 3 else None, idempotency_key=names[i])
             for i in range(24)]
    jobs = client.schedule_many(specs)
    one_kind = client.schedule_many([JobSpec("c", queue="bulk", priority=i % 2 * 3)
                                     for i in range(20)])
    assert len({j.partition for j in one_kind}) == 1  # type: ignore[union-attr]
    for spec, job in [*zip(specs, jobs, strict=True), *zip([JobSpec("c", queue="bulk",
                      priority=i % 2 * 3) for i in range(20)], one_kind, strict=True)]:
        assert not isinstance(job, Exception)
        hist = events(r, job.partition, job_id=job.id)
        direct = not spec.paused and spec.run_at is None
        assert [e["e"] for e in hist] == ["scheduled", "dispatched"][:2 if direct else 1]
        for e in hist:
            assert (e["ty"], e["q"]) == (spec.type, spec.queue), (spec, e)
        score = r.zscore(keys.due(job.partition), job.id)
        if direct:
            assert score is None and hist[1]["r"] == f"{job.id}@{job.next_ms}"
            assert hist[1]["a"] == "1"
            assert any(e["j"] == job.id for e in stream_entries(r, job.partition, spec.queue))
        elif spec.paused:
            assert score is None
        else:
            assert score == later - spec.priority / 2048
