"""Dispatchers against a real redis-server: leases and fencing, the claim of due occurrences,
misfire and jitter, the pubsub wake-up, and the start-up checks every process makes.

Most tests step LeaseKeeper / Claimer / Dispatcher.claim_once with an injected clock, so nothing
sleeps; the wake-up test runs the real loops.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from support.helpers import (
    PARTITIONS,
    ManualClock,
    Monitor,
    Rig,
    aredis,
    event_types,
    events,
    hgetall,
    keys_in_partition,
    record_script_calls,
    run_engine,
    settings,
    snapshot,
    stream_entries,
)

from rsched import App, Client, Job, JobContext, JobStatus, RunState
from rsched.core.cron import parse_cron
from rsched.core.errors import UnsafeRedis
from rsched.core.spec import jitter_offset_ms, ms_to_iso
from rsched.engine.dispatcher import Dispatcher, LeaseKeeper
from rsched.engine.dispatcher.claimer import Claimer, retry_item
from rsched.engine.worker.worker import Worker
from rsched.rdb import keys, scripts
from rsched.rdb.due_reads import pairs
from rsched.service.shapes import job_json

LEASE_MS = 10_000
MINUTE = 60_000
# How far ahead of the injected clock a test schedules what must wait in the due set: Redis's
# clock runs on meanwhile, and a job it already sees due goes straight to its queue (schedule.lua),
# so this leaves a busy machine a minute's stall.
AHEAD = MINUTE


def lease_owners(r: redis.Redis) -> dict[int, tuple[str, int]]:
    out = {}
    for p in range(PARTITIONS):
        h = hgetall(r, keys.lease(p))
        if h:
            out[p] = (h[b"owner"].decode(), int(h[b"fence"]))
    return out


# --- claim -------------------------------------------------------------------------------------


def test_a_due_one_off_job_is_dispatched_once_under_a_deterministic_run_id_and_a_future_one_is_not(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    # Due by the dispatcher's clock, not yet when scheduled (a job scheduled due goes straight
    # to its queue: test_a_job_scheduled_due_is_queued_by_the_schedule_script_alone)
    due = client.schedule("email", {"to": "a@x"}, run_at=clock() + 5000)
    later = client.schedule("email", {"to": "b@x"}, run_at=clock() + MINUTE)

    async def scenario() -> None:
        clock.advance(5000)
        async with Rig(redis_url, clock=clock) as rig:
            assert len(await rig.lease()) == PARTITIONS
            first = await rig.claim()
            assert first.dispatched == 1
            assert first.earliest_ms == later.next_ms
            again = await rig.claim()
            assert again.dispatched == 0
            clock.advance(MINUTE)
            assert (await rig.claim()).dispatched == 1

    asyncio.run(scenario())

    for job in (due, later):
        rid = f"{job.id}@{job.next_ms}"
        entries = [e for e in stream_entries(r, job.partition) if e["j"] == job.id]
        assert [e["r"] for e in entries] == [rid]
        # A first attempt's entry leaves its attempt out (core.wire: absent reads as 1).
        assert entries[0]["s"] == str(job.next_ms) and "a" not in entries[0]
        run = client.get_run(rid)
        assert run.state is RunState.DISPATCHED and run.attempt == 1 and run.sched_ms == job.next_ms
        assert r.zscore(keys.due(job.partition), job.id) is None
        assert event_types(r, job.partition, job.id) == ["scheduled", "dispatched"]


def test_jobs_due_at_the_same_time_are_dispatched_by_priority_after_earlier_ones(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    at = clock() + AHEAD  # a backlog in the due set once the clock passes it
    k = keys_in_partition(3, 5)
    jobs = {
        "low": client.schedule("t", run_at=at, priority=-3, idempotency_key=k[0]),
        "mid": client.schedule("t", run_at=at, priority=0, idempotency_key=k[1]),
        "high": client.schedule("t", run_at=at, priority=5, idempotency_key=k[2]),
        "earlier-low": client.schedule("t", run_at=at - 1, priority=-10, idempotency_key=k[3]),
        "not-due-high": client.schedule("t", run_at=at + 5000, priority=99, idempotency_key=k[4]),
    }

    async def scenario() -> None:
        clock.advance(AHEAD + 1000)
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            assert (await rig.claim()).dispatched == 4

    asyncio.run(scenario())
    by_id = {j.id: name for name, j in jobs.items()}
    order = [by_id[e["j"]] for e in stream_entries(r, 3)]
    assert order == ["earlier-low", "high", "mid", "low"]


def test_priority_orders_same_millisecond_jobs_across_claim_batches(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """The due score carries the priority, so Redis hands out the highest priority first even
    when more jobs are due in one millisecond than one claim call takes."""
    at = clock() + AHEAD  # a backlog in the due set once the clock passes it
    k = keys_in_partition(5, 6)
    prios = [0, 7, -2, 3, 1000, -1000]
    ids = {client.schedule("t", run_at=at, priority=pr, idempotency_key=key).id: pr
           for pr, key in zip(prios, k, strict=True)}

    async def scenario() -> None:
        clock.advance(AHEAD + 1000)
        async with Rig(redis_url, clock=clock, dispatcher_kw={"batch": 2}) as rig:
            await rig.lease()
            for _ in range(3):
                assert (await rig.claim()).dispatched == 2

    asyncio.run(scenario())
    assert [ids[e["j"]] for e in stream_entries(r, 5)] == sorted(prios, reverse=True)
    assert {e["s"] for e in stream_entries(r, 5)} == {str(at)}  # all ran as due at `at`


def test_a_job_on_a_queue_the_dispatcher_has_not_seen_is_dispatched_in_the_same_round(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    k = keys_in_partition(2, 2)

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            client.schedule("t", run_at=clock() + AHEAD, idempotency_key=k[0])
            clock.advance(AHEAD)
            assert (await rig.claim()).dispatched == 1  # the claimer now knows queue default
            mail.append(client.schedule("t", run_at=clock() + AHEAD, queue="mail",
                                        idempotency_key=k[1]))
            clock.advance(AHEAD)
            assert (await rig.claim()).dispatched == 1

    mail: list[Job] = []
    asyncio.run(scenario())
    assert [e["j"] for e in stream_entries(r, 2, "mail")] == [mail[0].id]


def test_jobs_scheduled_after_the_dispatcher_first_read_no_queues_are_claimed_in_one_call(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    # A dispatcher up before any job (as in `make bench`) read the partition's queues empty:
    # kept, its first claim would pass no queue stream and hand every job back to go the
    # recurring way (a read per job and a second claim call).
    k = keys_in_partition(4, 3)
    calls, recording = record_script_calls("claim")

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock, dispatcher_kw={"call_many": recording}) as rig:
            assert (await rig.claim()).dispatched == 0
            for key in k:
                client.schedule("t", run_at=clock() + AHEAD, idempotency_key=key)
            clock.advance(AHEAD)
            assert (await rig.claim()).dispatched == 3

    asyncio.run(scenario())
    assert len(calls) == 1
    assert len(stream_entries(r, 4)) == 3


def test_the_loops_rounds_read_only_partitions_with_something_due_and_miss_nothing(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """skip_idle (the dispatcher's loop): a partition whose earliest entry is later than the
    horizon is not read; a wake message naming it, or the periodic full read, brings it back.
    What a round read is what reached Redis: the partitions whose due set a command named."""
    dues = {keys.due(p).encode(): p for p in range(PARTITIONS)}

    def read(mon: Monitor) -> set[int]:
        """The partitions whose due set the commands since the last look named."""
        return {dues[arg] for c in mon.commands() for arg in c.args if arg in dues}

    [k1], [k2], [k3] = (keys_in_partition(p, 1, f"skip{p}") for p in (1, 2, 3))
    a = client.schedule("t", run_at=clock() + MINUTE, idempotency_key=k1)
    client.schedule("t", run_at=clock() + 2 * MINUTE, idempotency_key=k2)

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            with Monitor(r) as mon:
                claimer = rig.dispatcher.claimer
                assert claimer is not None
                claimer.full_read_s = 3600.0  # no periodic full read unless a step asks for one
                forget = claimer.forget  # for the wrapper below, where claimer is not narrowed
                first = await rig.dispatcher.claim_once(skip_idle=True)  # nothing known yet: all
                assert read(mon) == set(range(PARTITIONS)) and first.dispatched == 0
                assert first.earliest_ms == a.next_ms
                idle = await rig.dispatcher.claim_once(skip_idle=True)
                # Nothing due: no command at all.
                assert (mon.commands(), idle.earliest_ms) == ([], a.next_ms)
                clock.ms += MINUTE
                await rig.lease()  # the clock jumped past the lease: take it again
                mon.commands()  # from here on
                due = await rig.dispatcher.claim_once(skip_idle=True)
                assert (read(mon), due.dispatched) == ({1}, 1)
                # A job due now in partition 3, which the claimer last saw empty: not read...
                c = client.schedule("t", run_at=clock() - 1, idempotency_key=k3)
                mon.commands()
                assert (await rig.dispatcher.claim_once(skip_idle=True)).dispatched == 0
                assert read(mon) == set()
                # ...until the wake message for partition 3 (the dispatcher's listener calls this).
                claimer.forget(3)
                assert (await rig.dispatcher.claim_once(skip_idle=True)).dispatched == 1
                assert read(mon) == {3}
                assert client.get(c.id).last_run_id is not None
                # A wake during a round that had already read the partition is not lost: the round
                # cannot overwrite it with what it read before the change.
                [k4] = keys_in_partition(3, 1, "skip-race")
                real = claimer.r
                woken: list[str] = []

                class WakeAfterRead:  # the client's change and wake land while the round runs
                    def __getattr__(self, name: str) -> Any:
                        return getattr(real, name)

                    def pipeline(self, *args: Any, **kw: Any) -> Any:
                        pipe = real.pipeline(*args, **kw)
                        execute = pipe.execute

                        async def execute_then_wake(*a: Any, **k: Any) -> Any:
                            res = await execute(*a, **k)
                            if not woken:
                                woken.append(client.schedule("t", run_at=clock() - 1,
                                                             idempotency_key=k4).id)
                                forget(3)
                            return res

                        pipe.execute = execute_then_wake
                        return pipe

                claimer.full_read_s = 0.0  # this round reads partition 3
                claimer.r = WakeAfterRead()
                await rig.dispatcher.claim_once(skip_idle=True)
                claimer.r = real
                claimer.full_read_s = 3600.0
                mon.commands()
                assert (await rig.dispatcher.claim_once(skip_idle=True)).dispatched == 1
                assert read(mon) == {3} and client.get(woken[0]).last_run_id is not None
                # What changes unannounced (a worker's retry) is found by the periodic full read.
                p = a.partition
                client.r.zadd(keys.retry(p), {f"{a.id}@{clock() - 5}": clock() - 5})
                mon.commands()
                await rig.dispatcher.claim_once(skip_idle=True)
                assert p not in read(mon)
                claimer.full_read_s = 0.0
                await rig.dispatcher.claim_once(skip_idle=True)
                assert read(mon) == set(range(PARTITIONS))
                # Rounds without skip_idle (tests, Rig) read every partition, as before.
                claimer.full_read_s = 3600.0
                await rig.dispatcher.claim_once()
                assert read(mon) == set(range(PARTITIONS))

    asyncio.run(scenario())


def test_a_recurring_job_advances_by_compare_and_set_so_a_claim_applied_twice_dispatches_once(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job = client.schedule("tick", cron="*/5 * * * *")
    assert job.next_ms is not None
    calls, recording = record_script_calls("claim")
    clock.ms = job.next_ms + 1000

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock, dispatcher_kw={"call_many": recording}) as rig:
            await rig.lease()
            assert (await rig.claim()).dispatched == 1

    asyncio.run(scenario())
    # First seen, a recurring job goes as a one-off item (ARGV[8] counts them) and comes back from
    # the claim script for its next time in Python, then goes again as an item of kind 'j'.
    assert [(c[2][5], c[2][7]) for c in calls] == [(0, 1), (1, 0)]
    assert calls[1][2][10] == "j"  # after ARGV[10], the history list's bound
    nxt = parse_cron("*/5 * * * *", "UTC").next_after(job.next_ms)
    assert client.get(job.id).next_ms == nxt
    assert r.zscore(keys.due(job.partition), job.id) == nxt
    before = snapshot(r)

    name, ks, args = calls[-1]
    again = scripts.call(r, name, ks, args)  # what a client retry after a lost reply does

    assert [int(again[0]), int(again[1])] == [0, 1]  # nothing dispatched, one skipped
    assert snapshot(r) == before
    assert [e["r"] for e in stream_entries(r, job.partition)] == [f"{job.id}@{job.next_ms}"]


def test_a_due_retry_entry_whose_run_is_gone_is_dropped_so_the_loop_can_sleep(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job = client.schedule("t", run_at=clock() + MINUTE)
    p = job.partition
    stale = f"{job.id}@{clock() - 10}"  # no run hash: deleted, or expired meanwhile
    r.zadd(keys.retry(p), {stale: clock() - 10})

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            res = await rig.claim()
            assert (res.dispatched, res.skipped) == (0, 1)
            assert res.earliest_ms == job.next_ms  # not the stale entry's time

    asyncio.run(scenario())
    assert r.zscore(keys.retry(p), stale) is None


def test_a_claim_with_a_stale_fence_changes_nothing_in_the_keyspace(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    for p in range(PARTITIONS):  # due work in every partition
        for key in keys_in_partition(p, 2):
            client.schedule("email", {"key": key}, run_at=clock() + 1000, idempotency_key=key)
    client.schedule("tick", cron="* * * * *")

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock, dispatcher_id="d-old") as old, \
                Rig(redis_url, clock=clock, dispatcher_id="d-new") as new:
            old_fences = await old.lease()
            assert set(old_fences.values()) == {1}
            clock.advance(LEASE_MS + 1)  # d-old stalls (GC pause, SIGSTOP) past its lease
            assert (await new.lease()) == dict.fromkeys(range(PARTITIONS), 2)
            before = snapshot(r)

            res = await old.claim(renew=False)  # d-old wakes up and carries on with its old fences

            assert snapshot(r) == before
            assert res.dispatched == 0 and sorted(res.lost) == sorted(old_fences)
            assert old.dispatcher.leases is not None and old.dispatcher.leases.owned == {}
            clock.advance(MINUTE)
            assert (await new.claim()).dispatched == 2 * PARTITIONS + 1

    asyncio.run(scenario())


# --- leases ------------------------------------------------------------------------------------


def keeper(r: aioredis.Redis, owner: str, clock: ManualClock) -> LeaseKeeper:
    return LeaseKeeper(r, owner, PARTITIONS, LEASE_MS, clock)


def test_each_acquisition_increments_the_fence_and_renewal_keeps_it(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    async def scenario() -> None:
        async with aredis(redis_url) as ar:
            d1, d2 = keeper(ar, "d1", clock), keeper(ar, "d2", clock)
            assert await d1.run_once() == dict.fromkeys(range(PARTITIONS), 1)
            for _ in range(3):  # renewals well inside the lease: same fence, later expiry
                clock.advance(LEASE_MS // 2)
                assert await d1.run_once() == dict.fromkeys(range(PARTITIONS), 1)
                assert int(r.hget(keys.lease(0), "expires_ms") or 0) == clock() + LEASE_MS
            await d1.release_all()
            assert lease_owners(r)[0] == ("", 1)
            assert await d2.run_once() == dict.fromkeys(range(PARTITIONS), 2)
            await d2.release_all()
            assert await d1.run_once() == dict.fromkeys(range(PARTITIONS), 3)

    asyncio.run(scenario())
    assert int(r.hget(keys.stats(0), "lease_changes") or 0) == 3


def test_when_a_dispatcher_stops_renewing_another_takes_over_after_expiry_with_fence_plus_one(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    async def scenario() -> None:
        async with aredis(redis_url) as ar:
            dead, live = keeper(ar, "d-dead", clock), keeper(ar, "d-live", clock)
            await dead.run_once()
            await live.run_once()  # joins: its half is still held by d-dead
            assert live.owned == {}
            clock.advance(LEASE_MS - 1)
            await live.run_once()  # d-dead's lease has 1 ms left: nothing to take yet
            assert live.owned == {}
            clock.advance(2)
            assert await live.run_once() == dict.fromkeys(range(PARTITIONS), 2)
            assert await dead.run_once() == {}  # its renewals are refused: it lost every lease

    asyncio.run(scenario())
    assert {owner for owner, _ in lease_owners(r).values()} == {"d-live"}


def test_partitions_rebalance_to_an_even_split_as_dispatchers_join_and_leave(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    async def scenario() -> list[tuple[str, list[int]]]:
        seen: list[tuple[str, list[int]]] = []
        live: list[LeaseKeeper] = []

        async def settle(label: str) -> None:
            for _ in range(3):  # a join or leave converges in two rounds: release, then acquire
                for k in live:
                    await k.run_once()
                clock.advance(1000)
            owned = [set(k.owned) for k in live]
            assert set().union(*owned) == set(range(PARTITIONS)), label
            assert sum(len(o) for o in owned) == PARTITIONS, f"{label}: a partition owned twice"
            seen.append((label, sorted((len(o) for o in owned), reverse=True)))

        async with aredis(redis_url) as ar:
            for name in ("d1", "d2", "d3"):
                live.append(keeper(ar, name, clock))
                await settle(f"{name} joined")
            for _ in range(2):
                await live.pop(1).release_all()
                await settle("one left")
        return seen

    seen = asyncio.run(scenario())
    assert [split for _, split in seen] == [[16], [8, 8], [6, 5, 5], [8, 8], [16]]
    owners = lease_owners(r)
    assert {o for o, _ in owners.values()} == {"d1"}


# --- misfire and jitter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("misfire", "late_min", "ran_min", "resume_min", "gap"),
    [
        # Down 10.5 minutes, 60 s window: 0..9 are older than the window; run_once runs the
        # latest of them (9) and skips 0..8 as one gap; 10 (30 s late) runs; then 11 on time.
        ("run_once", 10.5, [9, 10], 11, (9, 0, 8)),
        ("skip", 10.5, [10], 11, (10, 0, 9)),  # skip: none of the old ones runs
        ("skip", 0.5, [0], 1, None),  # late by less than the window: not a misfire
        ("run_once", 0.5, [0], 1, None),
    ],
)
def test_a_recurring_job_after_a_dispatcher_outage_runs_its_window_and_records_the_gap_once(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, misfire: str,
    late_min: float, ran_min: list[int], resume_min: int, gap: tuple[int, int, int] | None,
) -> None:
    job = client.schedule("tick", cron="* * * * *", misfire=misfire)
    t0 = job.next_ms
    assert t0 is not None
    clock.ms = t0 + int(late_min * MINUTE)

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            for _ in range(5):  # more rounds than due occurrences: each round runs one
                await rig.claim()
            assert client.get(job.id).next_ms == t0 + resume_min * MINUTE  # no storm
            clock.ms = t0 + resume_min * MINUTE
            assert (await rig.claim()).dispatched == 1

    asyncio.run(scenario())
    runs = [e["r"] for e in stream_entries(r, job.partition)]
    assert runs == [f"{job.id}@{t0 + m * MINUTE}" for m in [*ran_min, resume_min]]
    stored = client.get(job.id).last_gap
    skipped = [e for e in events(r, job.partition, job_id=job.id) if e["e"] == "skipped"]
    if gap is None:
        assert stored is None and skipped == []
    else:
        size, first, last = gap
        assert stored is not None
        assert (stored.size, stored.first_ms, stored.last_ms, stored.exact) == (
            size, t0 + first * MINUTE, t0 + last * MINUTE, True)
        assert len(skipped) == 1  # recorded once per gap
        assert skipped[0]["r"] == f"{job.id}@{t0 + first * MINUTE}"
        assert skipped[0]["err"].startswith(f"catch-up: {size} occurrence(s)")
        assert job_json(client.get(job.id))["lastGap"] == {
            "count": size, "exact": True, "from": ms_to_iso(t0 + first * MINUTE),
            "to": ms_to_iso(t0 + last * MINUTE)}


def test_jitter_spreads_occurrences_within_plus_minus_n_seconds_deterministically(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    jitter_ms = 20_000
    cron = "* * * * *"
    jobs = [client.schedule("report", cron=cron, jitter_ms=jitter_ms, idempotency_key=f"j{i}")
            for i in range(100)]
    nominal = jobs[0].next_ms
    assert nominal is not None and all(j.next_ms == nominal for j in jobs)

    def offsets(at: int) -> list[int]:
        return [int(r.zscore(keys.due(j.partition), j.id) or 0) - at for j in jobs]

    first = offsets(nominal)
    assert first == [jitter_offset_ms(j.id, nominal, jitter_ms) for j in jobs]
    assert all(-jitter_ms <= o <= jitter_ms for o in first)
    assert min(first) < -jitter_ms // 2 and max(first) > jitter_ms // 2  # really spread
    # scheduling again (same keys) changes nothing: the jitter is a function of id and time
    assert [client.schedule("report", cron=cron, jitter_ms=jitter_ms, idempotency_key=f"j{i}").id
            for i in range(100)] == [j.id for j in jobs]
    assert offsets(nominal) == first

    clock.ms = nominal - jitter_ms - 1

    async def scenario() -> None:
        async with Rig(redis_url, clock=clock) as rig:
            await rig.lease()
            assert (await rig.claim()).dispatched == 0
            clock.ms = nominal + jitter_ms
            assert (await rig.claim()).dispatched == len(jobs)

    asyncio.run(scenario())
    following = nominal + MINUTE
    second = offsets(following)
    assert all(-jitter_ms <= o <= jitter_ms for o in second)
    assert second == [jitter_offset_ms(j.id, following, jitter_ms) for j in jobs]
    assert second != first
    for j in jobs:  # run ids carry the nominal time, not the jittered one
        assert client.get(j.id).last_run_id == f"{j.id}@{nominal}"


# --- wake-up -----------------------------------------------------------------------------------


def test_a_job_due_in_200_ms_starts_within_tens_of_ms_though_the_dispatcher_may_sleep_1_s(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    # No periodic full read: only the wake message naming a job's partition makes the loop
    # (which skips partitions it saw idle) read it again.
    app = App("wake")

    @app.job("ping")
    async def ping(ctx: JobContext) -> int:
        return ctx.attempt

    jobs: list[str] = []

    def all_done() -> bool:
        return len(jobs) == 3 and all(
            client.get(j).status is JobStatus.COMPLETED for j in jobs
        )

    async def schedule_while_idle() -> None:
        await asyncio.sleep(0.4)  # leases taken, nothing due: the dispatcher sleeps up to 1 s
        for pause_s in (0.0, 0.35, 0.6):
            await asyncio.sleep(pause_s)
            jobs.append(client.schedule("ping", run_at=client.now_ms() + 200).id)

    asyncio.run(run_engine(
        redis_url, app, all_done, timeout_s=15, while_running=schedule_while_idle,
        dispatcher_kw={"max_sleep_ms": 1000, "full_read_s": 3600.0}, worker_kw={"concurrency": 4},
    ))
    lags = []
    for job_id in jobs:
        job = client.get(job_id)
        assert job.last_run_id is not None
        run = client.get_run(job.last_run_id)
        assert run.state is RunState.SUCCEEDED and run.started_ms is not None
        lags.append(run.started_ms - run.sched_ms)
    print(f"start lags {lags} ms")  # shown with -s
    assert all(0 <= lag < 150 for lag in lags), f"start lags {lags} ms"


# --- start-up checks ---------------------------------------------------------------------------


async def set_up(kind: str, redis_url: str, **overrides: Any) -> None:
    s = settings(redis_url, **overrides)
    proc: Dispatcher | Worker = Dispatcher(s) if kind == "dispatcher" else Worker(App(), s)
    try:
        await proc.setup()
    finally:
        if isinstance(proc, Worker):
            await proc.close()
        else:
            await proc.r.aclose()


@pytest.mark.parametrize("kind", ["dispatcher", "worker"])
def test_a_process_refuses_to_start_against_a_redis_that_evicts_keys_unless_explicitly_allowed(
    redis_url: str, r: redis.Redis, kind: str
) -> None:
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(UnsafeRedis, match="allkeys-lru"):
            asyncio.run(set_up(kind, redis_url))
        assert r.hget(keys.config(), "partitions") is None  # refused before writing anything
        asyncio.run(set_up(kind, redis_url, allow_unsafe_redis=True))
    finally:
        r.config_set("maxmemory-policy", "noeviction")


@pytest.mark.parametrize("kind", ["dispatcher", "worker"])
def test_a_process_started_with_another_partition_count_refuses_to_run(
    redis_url: str, client: Client, kind: str
) -> None:
    client.schedule("ping")  # stores 16
    with pytest.raises(UnsafeRedis, match="16 partitions, not 8"):
        asyncio.run(set_up(kind, redis_url, partitions=8))
    asyncio.run(set_up(kind, redis_url, partitions=16))


@pytest.mark.parametrize("run_id, due, job_id", [
    ("3-01J@1700000000000", 1700000000000, "3-01J"), ("0-a@b@17", 17.5, "0-a@b"),
    ("12-x@0", 0, "12-x")])
def test_a_retry_item_names_the_job_of_its_run(run_id: str, due: float, job_id: str) -> None:
    item = retry_item(run_id, due)
    assert (item.job_id, item.run_id, item.score) == (job_id, run_id, due)


@pytest.mark.parametrize("protocol", [2, 3])
def test_raw_due_reads_give_the_pairs_redis_py_gives_on_either_protocol(
    redis_url: str, r: redis.Redis, protocol: int
) -> None:
    r.zadd("z", {"a": 1700000000000, "b": 1700000000000 - 3 / 2048, "c": 17.5})
    rp = redis.Redis.from_url(redis_url, protocol=protocol)
    raw = rp.execute_command("ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", 0, 10, "WITHSCORES")
    plain = rp.zrangebyscore("z", "-inf", "+inf", start=0, num=10, withscores=True)
    assert [tuple(p) for p in pairs(raw)] == [tuple(p) for p in plain] and pairs([]) == []
    rp.close()


def test_each_partition_is_read_up_to_its_own_masters_clock_not_the_first_ones(
    redis_url: str, client: Client
) -> None:
    """On a cluster a round learns each master's TIME offset; the entries it reads next round
    reach past each partition's own master's clock.  Here the offsets say the first master runs
    5 minutes behind the master of every partition (as a cluster with that skew would): a
    trigger's run, due in the retry set by its own master's clock, is claimed in the round,
    not 5 minutes late."""
    job = client.schedule("t", run_at="2099-01-01T00:00:00Z")
    run_id = client.trigger(job.id)

    async def scenario() -> None:
        async with aredis(redis_url) as ar:
            owned = await LeaseKeeper(ar, "d1", PARTITIONS, LEASE_MS).run_once()
            claimer = Claimer(ar, "d1")
            claimer._offset_ms = -5 * MINUTE  # the first master's clock, as last read
            claimer._offsets = dict.fromkeys(range(PARTITIONS), 0)  # each partition's own
            assert (await claimer.run_once(owned)).dispatched == 1
            # What is left is due in a minute by its own master's clock; the round's clock is
            # the first master's, 5 minutes behind: the claimer says a minute, not six.
            soon = client.schedule("t", run_at=client.now_ms() + MINUTE)
            assert (await claimer.run_once(owned)).dispatched == 0
            real = claimer._offset_ms
            claimer._offset_ms = real - 5 * MINUTE
            claimer._offsets = dict.fromkeys(range(PARTITIONS), real)
            idle = await claimer.run_once(owned, skip_idle=True)  # reads nothing
            assert idle.earliest_ms is not None and idle.now_ms is not None
            wait_ms = idle.earliest_ms - idle.now_ms
            assert soon.next_ms is not None and 0 < wait_ms <= MINUTE + 1000, wait_ms

    asyncio.run(scenario())
    assert client.get_run(run_id).state.value == "dispatched"


def test_a_job_due_by_redis_time_but_past_the_clock_estimate_is_claimed_in_the_same_round(
    redis_url: str, client: Client
) -> None:
    """Due entries are read without their scores up to the clock estimate, and with them up
    to the horizon; those the round's TIME says are due go too.  Here the estimate lags Redis
    by 5 minutes (within a 10-minute horizon): only the second read finds the job."""
    job = client.schedule("t", run_at=client.now_ms() + 300)
    time.sleep(0.5)  # due by Redis's TIME

    async def scenario() -> None:
        async with aredis(redis_url) as ar:
            owned = await LeaseKeeper(ar, "d1", PARTITIONS, LEASE_MS).run_once()
            claimer = Claimer(ar, "d1", horizon_ms=10 * MINUTE)
            claimer._offset_ms = -5 * MINUTE  # the estimate: local clock 5 minutes behind
            assert (await claimer.run_once(owned)).dispatched == 1

    asyncio.run(scenario())
    assert client.get(job.id).last_run_id == f"{job.id}@{job.next_ms}"
