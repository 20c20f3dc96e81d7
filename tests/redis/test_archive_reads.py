"""The run-history archive's read side against a real redis-server and both stores (SQLite and
Postgres): the fold of events into attempts, job_runs merging archive and Redis page by page,
failures and duration statistics, and the engine's own events read back as one history.

Every behaviour test runs twice, once per store (``archive_url``, tests/support/archive.py).
The write side is in test_archive_writes.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from support import archive as archive_support
from support.archive import (
    PARTITIONS,
    archiver,
    attempt_events,
    drain,
    emit,
    redis_ids,
    stored,
)
from support.helpers import (
    ManualClock,
    Rig,
    keys_in_partition,
    redis_now_ms,
    settings,
    summary,
    xrange,
    xrevrange,
)

from rsched import App, Client, JobContext, JobSpec, ValidationError
from rsched.archive import (
    Archiver,
    ArchiverConfig,
    RunAttempt,
    Store,
    arecent_events,
    duration_stats,
    failures,
    fold,
    job_runs,
    runs_page,
)
from rsched.archive.events import EventRow, decode, expand, expand_flat
from rsched.rdb import keys

archive_url, store = archive_support.archive_url, archive_support.store  # fixtures, by name


# --- the read path -----------------------------------------------------------------------------


JOB = "1-01HISTORY"


def job_story(r: redis.Redis, base: int) -> None:
    """One job's life: successes, retries, a dead letter replayed, a reclaim, a skip, a trigger,
    a stale report, a run in flight; other jobs' events in between."""
    def run(i: int) -> str:
        return f"{JOB}@{base + i * 60_000}"

    for i in range(6):  # plain successes, some noise from another job in the same partition
        attempt_events(r, JOB, base + i * 60_000, 1, "succeeded", d=10 + i)
        attempt_events(r, "1-NOISE", base + i * 60_000, 1, "succeeded")
    s6 = base + 6 * 60_000  # failed, retried, succeeded
    attempt_events(r, JOB, s6, 1, "failed", err="ValueError: boom 1", d=100)
    emit(r, JOB, "retry_scheduled", r=run(6), a=1, t=s6 + 200, at=s6 + 2000, ty="email")
    attempt_events(r, JOB, s6, 2, "succeeded", d=30)
    s7 = base + 7 * 60_000  # dead-lettered, replayed, succeeded on its new attempt 1
    attempt_events(r, JOB, s7, 1, "failed", err="RuntimeError: down")
    emit(r, JOB, "dead_lettered", r=run(7), a=1, t=s7 + 10, err="RuntimeError: down", ty="email")
    emit(r, JOB, "replayed", r=run(7), t=s7 + 5000, ty="email")
    attempt_events(r, JOB, s7, 1, "succeeded", worker="w2", d=7)
    s8 = base + 8 * 60_000  # the worker died: abandoned, reclaimed, attempt 2 on another worker
    emit(r, JOB, "dispatched", r=run(8), a=1, t=s8, s=s8, ty="email", q="default")
    emit(r, JOB, "started", r=run(8), a=1, t=s8 + 1, w="w-dead", f=1, ty="email", s=s8)
    emit(r, JOB, "abandoned", r=run(8), a=1, t=s8 + 30_000, w="w-dead", ty="email",
         err="worker w-dead stopped heartbeating")
    emit(r, JOB, "reclaimed", r=run(8), a=1, t=s8 + 30_000, w="w2", ty="email")
    emit(r, JOB, "started", r=run(8), a=2, t=s8 + 30_000, w="w2", f=2, ty="email", s=s8)
    emit(r, JOB, "fenced", r=run(8), a=2, t=s8 + 30_001, w="w-dead", f=1, ty="email",
         err="stale report rejected")
    emit(r, JOB, "succeeded", r=run(8), a=2, t=s8 + 30_050, w="w2", d=50, ty="email", s=s8,
         res="42")
    s9 = base + 9 * 60_000
    emit(r, JOB, "skipped", r=run(9), t=s9 + 120_000, s=s9, ty="email", q="default",
         err="misfire: skipped an occurrence missed by more than the grace period")
    emit(r, JOB, "paused", t=s9 + 1)  # job events are not runs
    emit(r, JOB, "resumed", t=s9 + 2)
    s10 = base + 10 * 60_000  # failed; the job was cancelled while it waited for its retry
    attempt_events(r, JOB, s10, 1, "failed", err="IOError", d=3)
    emit(r, JOB, "retry_scheduled", r=run(10), a=1, t=s10 + 5, at=s10 + 1000, ty="email")
    emit(r, JOB, "cancelled", t=s10 + 6)
    emit(r, JOB, "abandoned", r=run(10), a=1, t=s10 + 1000, ty="email",
         err="job cancelled before the retry ran")
    s11 = base + 11 * 60_000  # in flight: dispatched and started, no outcome yet
    emit(r, JOB, "triggered", r=run(11), t=s11, ty="email")
    emit(r, JOB, "dispatched", r=run(11), a=1, t=s11, s=s11, ty="email", q="default")
    emit(r, JOB, "started", r=run(11), a=1, t=s11 + 2, w="w3", f=1, ty="email", s=s11)
    s12 = base + 12 * 60_000  # triggered, not dispatched yet: no attempt to show
    emit(r, JOB, "triggered", r=run(12), t=s12, ty="email")
    s13 = base + 13 * 60_000  # started and finished within one report: no 'started' event
    emit(r, JOB, "dispatched", r=run(13), a=1, t=s13, s=s13, ty="email", q="default")
    emit(r, JOB, "succeeded", r=run(13), a=1, t=s13 + 9, w="w4", d=6, ty="email", q="default",
         s=s13, res="13", st=s13 + 3, f=1)
    s14 = base + 14 * 60_000  # stopped by overlap cancelPrevious: final, its reason shown
    emit(r, JOB, "dispatched", r=run(14), a=1, t=s14, s=s14, ty="email", q="default")
    emit(r, JOB, "started", r=run(14), a=1, t=s14 + 2, w="w5", f=1, ty="email", s=s14)
    emit(r, JOB, "cancelled", r=run(14), a=1, t=s14 + 400, w="w5", d=398, ty="email",
         q="default", s=s14, err="cancelled: overlap cancelPrevious, a later occurrence "
                                 "replaces it")


def all_events(r: redis.Redis, partitions: int = PARTITIONS) -> list[Any]:
    return [decode(p, sid, f) for p in range(partitions) for eid, entry in xrange(r, keys.events(p))
            for sid, f in expand(eid, entry)]


def expected_history(r: redis.Redis) -> list[RunAttempt]:
    attempts = [a for a in fold(all_events(r)) if a.job_id == JOB]
    return sorted(attempts, key=lambda a: a.key, reverse=True)


def walk(store: Store | None, r: redis.Redis, limit: int) -> list[RunAttempt]:
    """Every page of job_runs, concatenated."""
    out: list[RunAttempt] = []
    cursor = None
    for _ in range(100):
        page = job_runs(store, r, JOB, limit=limit, cursor=cursor)
        assert not page.partial
        assert len(page.items) <= limit
        out += page.items
        cursor = page.next_cursor
        if cursor is None:
            return out
    raise AssertionError("pagination did not end")


def plain(attempts: list[RunAttempt]) -> list[RunAttempt]:
    return [dataclasses.replace(a, archived=False) for a in attempts]


def test_the_fold_reads_a_jobs_life_as_attempts(r: redis.Redis) -> None:
    job_story(r, 1_700_000_000_000)
    got = {(a.sched_ms - 1_700_000_000_000) // 60_000: a for a in expected_history(r)}
    h = expected_history(r)
    assert len(h) == 17 and [a.key for a in h] == sorted((a.key for a in h), reverse=True)
    by_run = [(i, a.replays, a.attempt, a.status) for a in h
              if (i := (a.sched_ms - 1_700_000_000_000) // 60_000) >= 6]
    assert by_run == [
        (14, 0, 1, "cancelled"), (13, 0, 1, "succeeded"), (11, 0, 1, "running"),
        (10, 0, 1, "failed"), (9, 0, 0, "skipped"),
        (8, 0, 2, "succeeded"), (8, 0, 1, "abandoned"), (7, 1, 1, "succeeded"),
        (7, 0, 1, "failed"), (6, 0, 2, "succeeded"), (6, 0, 1, "failed"),
    ]
    assert (got[0].status, got[0].duration_ms, got[0].result) == ("succeeded", 10, {"ok": True})
    run7 = [a for a in h if a.run_id.endswith(str(1_700_000_000_000 + 7 * 60_000))]
    assert run7[1].dead_lettered and run7[1].error == "RuntimeError: down"
    assert not run7[0].dead_lettered and run7[0].worker == "w2"
    run8 = [a for a in h if a.run_id.endswith(str(1_700_000_000_000 + 8 * 60_000))]
    assert run8[0].worker == "w2" and run8[0].fence == 2 and run8[0].result == 42
    assert run8[1].worker == "w-dead" and run8[1].error == "worker w-dead stopped heartbeating"
    run6 = [a for a in h if a.run_id.endswith(str(1_700_000_000_000 + 6 * 60_000))]
    assert run6[1].retry_at_ms == 1_700_000_000_000 + 6 * 60_000 + 2000
    assert got[10].error == "IOError"  # failed, then abandoned on cancel: the failure shows
    # The start carried by the outcome event of a run started and finished in one report.
    assert got[13].started_ms is not None
    assert (got[13].started_ms - got[13].sched_ms, got[13].fence, got[13].worker) == (3, 1, "w4")
    assert got[14].ended_ms is not None
    assert (got[14].status, got[14].worker, got[14].ended_ms - got[14].sched_ms) == (
        "cancelled", "w5", 400)
    assert got[14].error is not None and got[14].error.startswith("cancelled: overlap")


def test_the_run_attempts_view_folds_events_like_the_read_path(
    r: redis.Redis, store: Store
) -> None:
    job_story(r, 1_700_000_000_000)
    drain(archiver(r, store))
    cols = ("job_id, run_id, replays, attempt, sched_ms, status, dead_lettered, job_type, queue, "
            "dispatched_ms, started_ms, ended_ms, duration_ms, worker, fence, error, result, "
            "retry_at_ms")
    view = sorted(tuple(row) for row in store.fetchall(f"SELECT {cols} FROM run_attempts"))
    folded = sorted(
        (a.job_id, a.run_id, a.replays, a.attempt, a.sched_ms, a.status, int(a.dead_lettered),
         a.job_type, a.queue, a.dispatched_ms, a.started_ms, a.ended_ms, a.duration_ms, a.worker,
         a.fence, a.error, None if a.result is None else json.dumps(a.result,
                                                                    separators=(",", ":")),
         a.retry_at_ms)
        for a in fold(store.job_events(JOB, None, None) + store.job_events("1-NOISE", None, None)))
    assert len(view) == 23
    assert view == folded


@pytest.mark.parametrize("limit", [1, 4, 50])
def test_job_runs_merges_archive_and_redis_without_gap_or_duplicate_at_every_stage(
    r: redis.Redis, store: Store, limit: int
) -> None:
    job_story(r, redis_now_ms(r) - 3_600_000)
    want = plain(expected_history(r))
    assert walk(store, r, limit) == want  # nothing archived yet: all from Redis
    assert walk(None, r, limit) == want  # no archive configured at all

    a = archiver(r, store, batch=13)
    a.run_once()  # part archived and trimmed, the rest still in Redis
    assert 0 < len(stored(store)) < len(want) * 3
    assert plain(walk(store, r, limit)) == want

    crashed = archiver(r, store, batch=9)
    crashed.commit(crashed.read())  # committed, not acknowledged: in both places
    assert set(stored(store)) & set(redis_ids(r))
    assert plain(walk(store, r, limit)) == want

    drain(a)  # a second archiver finishes; the crashed one's entries stay pending
    restarted = Archiver(r, store, PARTITIONS, ArchiverConfig(), consumer=crashed.consumer)
    assert restarted.run_once().inserted == 0
    assert redis_ids(r) == []
    got = walk(store, r, limit)
    assert plain(got) == want and all(x.archived for x in got)


def test_an_asyncio_caller_gets_the_same_pages(
    redis_url: str, r: redis.Redis, store: Store
) -> None:
    """The API's way: scan Redis on its event loop, then run the store part in a thread."""
    job_story(r, redis_now_ms(r) - 3_600_000)
    a = archiver(r, store, batch=13)
    a.run_once()

    async def pages() -> list[RunAttempt]:
        ar = AsyncRedis.from_url(redis_url)
        out: list[RunAttempt] = []
        cursor = None
        try:
            while True:
                recent, partial = await arecent_events(ar, JOB)
                page = await asyncio.to_thread(runs_page, store, JOB, recent, partial, 4, cursor)
                out += page.items
                cursor = page.next_cursor
                if cursor is None:
                    return out
        finally:
            await ar.aclose()

    assert asyncio.run(pages()) == walk(store, r, 4)


def test_job_runs_pages_do_not_shift_when_new_runs_arrive(r: redis.Redis, store: Store) -> None:
    base = redis_now_ms(r) - 3_600_000
    for i in range(5):
        attempt_events(r, JOB, base + i * 1000, 1, "succeeded")
    first = job_runs(store, r, JOB, limit=2)
    attempt_events(r, JOB, base + 10_000, 1, "succeeded")  # a newer run lands meanwhile
    drain(archiver(r, store))
    second = job_runs(store, r, JOB, limit=2, cursor=first.next_cursor)
    third = job_runs(store, r, JOB, limit=2, cursor=second.next_cursor)
    scheds = [a.sched_ms - base for a in first.items + second.items + third.items]
    assert scheds == [4000, 3000, 2000, 1000, 0] and third.next_cursor is None


def test_job_runs_reports_a_partial_history_when_the_redis_backlog_exceeds_its_scan(
    r: redis.Redis, store: Store
) -> None:
    base = redis_now_ms(r) - 3_600_000
    attempt_events(r, JOB, base, 1, "succeeded")
    for i in range(30):
        attempt_events(r, "1-OTHER", base + i, 1, "succeeded")
    assert job_runs(store, r, JOB, max_scan=50).partial
    page = job_runs(store, r, JOB, max_scan=1000)
    assert not page.partial and len(page.items) == 1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"cursor": "garbage"}, "cursor"),
    ({"cursor": "1.2"}, "cursor"),
])
def test_job_runs_rejects_bad_input_naming_the_field(
    r: redis.Redis, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        job_runs(None, r, JOB, **kwargs)
    assert info.value.field == field


def test_failures_of_a_type_in_a_time_range_newest_first_and_paginated(
    r: redis.Redis, store: Store
) -> None:
    base = 1_700_000_000_000
    for i in range(10):
        job = f"{i % PARTITIONS}-F{i}"
        attempt_events(r, job, base + i * 1000, 1, "failed" if i % 2 else "succeeded",
                       err=f"E{i}" if i % 2 else None)
    emit(r, "0-T", "timed_out", r=f"0-T@{base}", a=1, t=base + 5500, ty="email", d=9,
         err="timed out after 9 ms")
    emit(r, "0-X", "failed", r=f"0-X@{base}", a=1, t=base + 5600, ty="other", err="other type")
    drain(archiver(r, store))
    items, cursor = [], None
    while True:
        page = failures(store, "email", base + 2000, base + 9000, limit=2, cursor=cursor)
        items += page.items
        cursor = page.next_cursor
        if cursor is None:
            break
    assert [(f.job_id, f.status, f.error) for f in items] == [
        ("3-F7", "failed", "E7"), ("0-T", "timed_out", "timed out after 9 ms"),
        ("1-F5", "failed", "E5"), ("3-F3", "failed", "E3"),
    ]
    every = failures(store, None, base, base + 10_000_000).items
    assert len(every) == 7 and {f.job_type for f in every} == {"email", "other"}
    with pytest.raises(ValidationError) as info:
        failures(store, "email", base, base)
    assert info.value.field == "since"


def test_duration_percentiles_per_type_are_nearest_rank(r: redis.Redis, store: Store) -> None:
    base = 1_700_000_000_000
    for i in range(1, 101):  # email: 1..100 ms, shuffled across partitions and outcomes
        job = f"{i % PARTITIONS}-D{i}"
        attempt_events(r, job, base + (i * 7919) % 100, 1, "failed" if i % 10 == 0 else
                       "succeeded", d=i, err="x" if i % 10 == 0 else None)
    for d in (5, 500):
        emit(r, "0-R", "succeeded", r=f"0-R@{base + d}", a=1, t=base + 10, ty="report", d=d)
    drain(archiver(r, store))
    stats = duration_stats(store, base, base + 1_000_000, quantiles=(0.5, 0.9, 0.95, 0.99, 1))
    email = stats["email"]
    assert (email.count, email.failed, email.max_ms) == (100, 10, 100)
    assert email.mean_ms == pytest.approx(50.5)
    assert email.quantiles == {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p100": 100}
    assert stats["report"].quantiles["p50"] == 5 and stats["report"].quantiles["p99"] == 500
    assert set(duration_stats(store, job_type="report")) == {"report"}
    assert duration_stats(store, base + 2_000_000, base + 3_000_000) == {}


def test_the_engines_own_events_are_archived_and_read_back_as_one_history(
    redis_url: str, r: redis.Redis, store: Store
) -> None:
    app = App()

    @app.job("flaky")
    async def flaky(ctx: JobContext) -> dict[str, int]:
        if ctx.attempt < 3:
            raise ValueError(f"boom {ctx.attempt}")
        return {"ok": ctx.attempt}

    client = Client(settings=settings(redis_url))
    clock = ManualClock(redis_now_ms(r))
    job = client.schedule("flaky", run_at=clock() - 1, max_attempts=3, backoff_base_ms=1000)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await rig.cycle()
            for _ in range(2):
                clock.ms = max(clock(), int(r.zscore(keys.retry(job.partition), rid) or 0))
                await rig.cycle()

    try:
        asyncio.run(scenario())
        partitions = client.partitions
        a = Archiver(r, store, partitions, ArchiverConfig(batch=4))
        a.setup()
        a.run_once()  # the first events archived, the rest still in Redis
        for _ in range(2):
            got = job_runs(store, r, job.id)
            assert [(x.attempt, x.status, summary(x.error), x.result) for x in got.items] == [
                (3, "succeeded", None, {"ok": 3}), (2, "failed", "ValueError: boom 2", None),
                (1, "failed", "ValueError: boom 1", None)]
            kept = client.runs(job.id)  # the engine's own bounded history agrees
            assert [(x.run_id, x.attempt, x.status, x.worker, x.duration_ms) for x in got.items] \
                == [(x.run_id, x.attempt, x.status, x.worker, x.duration_ms) for x in kept]
            while a.run_once().read:
                pass
        assert got.items[0].archived
        assert all(r.xlen(keys.events(p)) == 0 for p in range(partitions))
    finally:
        client.close()


def test_a_script_calls_events_share_an_entry_and_each_is_archived_as_a_row_of_its_own(
    redis_url: str, r: redis.Redis, store: Store
) -> None:
    """One claim and one report of many runs write one 'dispatched' and one 'succeeded' entry per
    partition; every run still gets its own archived rows, under ids no later entry takes."""
    app = App()

    @app.job("echo")
    async def echo(ctx: JobContext) -> dict[str, Any]:
        return {"n": ctx.payload["n"], "text": "line\nbreak\ttab"}  # JSON escapes both

    client = Client(settings=settings(redis_url))
    clock = ManualClock(redis_now_ms(r))
    # Due by the claim's clock only: jobs scheduled due would be queued by schedule.lua
    jobs = client.schedule_many([JobSpec("echo", {"n": i}, run_at=clock() + 1000,
                                         queue="default" if i % 3 else "other")
                                 for i in range(40)])

    async def scenario() -> None:
        clock.advance(2000)
        async with Rig(redis_url, app, clock=clock,
                       worker_kw={"queues": ["default", "other"], "concurrency": 4000}) as rig:
            claimed, started, reported = await rig.cycle()
            assert (claimed.dispatched, started, reported) == (40, 40, 40)

    try:
        asyncio.run(scenario())
        entries = [f for p in range(client.partitions) for _, f in xrange(r, keys.events(p))]
        batched = [f for f in entries if b"n" in f]
        assert batched and sum(int(f[b"n"]) for f in batched) > len(batched)
        # A later event, even within the same millisecond, gets an id above every id the batches
        # reserved (XADD <ms>-* takes the next sequence number of that millisecond).
        tops = [(x, xrevrange(r, keys.events(x), count=1)) for x in range(client.partitions)]
        p, top = next((x, t[0]) for x, t in tops if t and b"n" in t[0][1])
        last_ms = top[0].split(b"-")[0].decode()
        later = emit(r, f"{p}-x", "note", sid=f"{last_ms}-*")
        parts = client.partitions
        ids = redis_ids(r, parts)
        assert len(set(ids)) == len(ids)
        assert max(x for x in ids if x[2] == p)[:2] == tuple(map(int, later.split("-")))
        a = Archiver(r, store, parts, ArchiverConfig(poll_ms=10))
        a.setup()
        drain(a)
        assert stored(store) == ids
        rows = {(e.event, e.run_id): e for e in (EventRow(*x) for x in store.fetchall(
            "SELECT * FROM events"))}
        assert len([k for k in rows if k[0] in ("dispatched", "succeeded")]) == 2 * 40
        for i, job in enumerate(jobs):
            rid = f"{job.id}@{job.next_ms}"  # type: ignore[union-attr]
            queue = "default" if i % 3 else "other"
            d, ok = rows[("dispatched", rid)], rows[("succeeded", rid)]
            assert (d.job_id, d.attempt, d.job_type, d.queue) == (job.id, 1, "echo", queue)  # type: ignore[union-attr]
            assert (ok.job_id, ok.worker, ok.queue, ok.fence) == (job.id, "w-test", queue, 1)  # type: ignore[union-attr]
            assert json.loads(ok.result or "") == {"n": i, "text": "line\nbreak\ttab"}
            assert ok.started_ms is not None and ok.extra is None
            got = job_runs(store, r, job.id).items  # type: ignore[union-attr]
            assert [(x.run_id, x.status, x.result) for x in got] == [
                (rid, "succeeded", {"n": i, "text": "line\nbreak\ttab"})]
    finally:
        client.close()


def test_an_entry_holds_at_most_100_events_and_the_archiver_reads_packed_entries_in_fewer(
    redis_url: str, r: redis.Redis, store: Store
) -> None:
    """Scripts flush a batch of events at EVENTS_PER_ENTRY_MAX; once a partition's reads show
    such entries, the archiver asks for fewer entries, so a read stays near `batch` events."""
    client = Client(settings=settings(redis_url))
    wanted = iter(keys_in_partition(2, 1000, "cap"))  # one partition: reads are deterministic

    def schedule(n: int) -> None:
        client.schedule_many([JobSpec("t", run_at="2099-01-01T00:00:00Z",
                                      idempotency_key=next(wanted)) for _ in range(n)])

    try:
        parts = client.partitions
        schedule(250)
        sizes = [int(f.get(b"n", b"1")) for _, f in xrange(r, keys.events(2))]
        assert sizes == [100, 100, 50]
        a = Archiver(r, store, parts, ArchiverConfig(batch=100))
        a.setup()
        assert a.run_once().inserted == 250  # nothing seen yet: up to 100 entries a read
        schedule(250)
        # Entries of 100 events seen: one entry a read now.
        # (run_once reads ahead while it commits: some calls commit an empty read.)
        inserted = [n for n in (a.run_once().inserted for _ in range(8)) if n]
        assert inserted == [100, 100, 50]
        assert len(stored(store)) == 500
    finally:
        client.close()


def test_expand_reads_columns_and_shared_fields_and_keeps_a_malformed_batch_whole() -> None:
    entry = {b"e": b"succeeded", b"t": b"5", b"n": b"3", b"r": b"0-a@1\n0-b@2\n0-c@3",
             b"st": b"\n4\n", b"a": b"1", b"res": b"{}\n[]\nnull"}
    got = expand(b"100-7", entry)
    assert [sid for sid, _ in got] == [b"100-7", b"100-8", b"100-9"]
    assert [f.get(b"st") for _, f in got] == [None, b"4", None]
    assert [f[b"res"] for _, f in got] == [b"{}", b"[]", b"null"]
    assert all(f[b"a"] == b"1" and f[b"e"] == b"succeeded" and b"n" not in f for _, f in got)
    rows = [decode(0, sid, f) for sid, f in got]
    assert [(x.job_id, x.sched_ms, x.sid_seq) for x in rows] == [("0-a", 1, 7), ("0-b", 2, 8),
                                                                  ("0-c", 3, 9)]
    for bad in (b"x", b"0", b"1", b"-2"):
        assert expand(b"100-7", {**entry, b"n": bad}) == [(b"100-7", {**entry, b"n": bad})]
    assert json.loads(decode(0, b"100-7", {**entry, b"n": b"x"}).extra or "")["n"] == "x"
    # A column with the wrong number of values is read as shared: still one row per event.
    odd = expand(b"100-7", {**entry, b"r": b"0-a@1\n0-b@2"})
    assert len(odd) == 3 and odd[0][1][b"r"] == b"0-a@1\n0-b@2"
    flat = [x for kv in entry.items() for x in kv]
    assert [(sid, dict(zip(f[::2], f[1::2], strict=True))) for sid, f in expand_flat(b"100-7", flat)
            ] == got
