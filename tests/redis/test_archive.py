"""The run-history archive against a real redis-server and both stores (SQLite and Postgres).

Every behaviour test runs twice, once per store (``archive_url``); Postgres tests get a schema
of their own in the session's database.  The archiver is driven one batch at a time
(``run_once``, ``claim_once``); the crash and outage tests with real processes are in
test_archive_chaos.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.typing import EncodableT
from support import archive as archive_support
from support.archive import (
    PARTITIONS,
    archiver,
    attempt_events,
    drain,
    emit,
    produce,
    redis_ids,
    stored,
    stream_lengths,
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
    StoreUnavailable,
    arecent_events,
    duration_stats,
    failures,
    fold,
    job_runs,
    open_store,
    runs_page,
)
from rsched.archive.events import EventRow, decode, expand, expand_flat
from rsched.archive.postgres import partition_name
from rsched.archive.store import DAY_MS, SCHEMA_MIGRATIONS, migrations, redact, sqlite_path
from rsched.rdb import keys

# --- fixtures and helpers ------------------------------------------------------------------------

archive_url, store = archive_support.archive_url, archive_support.store  # fixtures, by name






















# --- schema ------------------------------------------------------------------------------------


def test_migrations_ship_in_the_package_for_both_dialects() -> None:
    for dialect in ("postgres", "sqlite"):
        found = migrations(dialect)
        assert [(m.version, m.name) for m in found] == [
            (1, "events"), (2, "run_attempts"), (3, "started_ms"), (4, "run_attempts_started")]
        assert "CREATE TABLE events" in found[0].sql and "CREATE VIEW run_attempts" in found[1].sql
    assert "PARTITION BY RANGE (sid_ms)" in migrations("postgres")[0].sql


def test_migrations_are_applied_on_start_once_and_recorded(archive_url: str) -> None:
    first = open_store(archive_url)
    second = open_store(archive_url)
    try:
        first.connect()
        assert first.applied_migrations() == [1, 2, 3, 4]
        second.connect()  # a second archiver starting later applies nothing again
        assert second.applied_migrations() == [1, 2, 3, 4]
        rows = second.fetchall("SELECT version, name FROM schema_migrations ORDER BY version")
        assert [tuple(row) for row in rows] == [
            (1, "events"), (2, "run_attempts"), (3, "started_ms"), (4, "run_attempts_started")]
        assert second.fetchall("SELECT count(*) FROM run_attempts") == [(0,)]
    finally:
        first.close()
        second.close()


@pytest.mark.postgres
def test_concurrent_starts_against_an_empty_postgres_migrate_once(pg_dsn: str) -> None:
    schema = f"t_{secrets.token_hex(4)}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    url = f"{pg_dsn}?options=-csearch_path%3D{schema}"
    stores = [open_store(url) for _ in range(4)]
    errors: list[BaseException] = []

    def start(s: Store) -> None:
        try:
            s.connect()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert stores[0].applied_migrations() == [1, 2, 3, 4]
    finally:
        for s in stores:
            s.close()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.postgres
def test_a_postgres_archive_at_version_2_upgrades_and_keeps_its_events(pg_dsn: str) -> None:
    """Migrations 3-4 (outcome events that carry their run's start) on a live partitioned table."""
    schema = f"t_{secrets.token_hex(4)}"
    url = f"{pg_dsn}?options=-csearch_path%3D{schema}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(SCHEMA_MIGRATIONS)
        for m in migrations("postgres")[:2]:
            conn.execute(m.sql.encode())
            conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, 0)", (m.version, m.name))
        conn.execute("CREATE TABLE events_old PARTITION OF events FOR VALUES FROM (0) TO (10)")
        conn.execute("INSERT INTO events (sid_ms, sid_seq, part, event, job_id, run_id, attempt, "
                     "ts_ms, worker, fence) VALUES (1, 0, 0, 'started', 'j', 'j@1', 1, 5, 'w', 1)")
    store = open_store(url)
    try:
        store.connect()
        assert store.applied_migrations() == [1, 2, 3, 4]
        assert store.fetchall("SELECT status, started_ms, fence, worker FROM run_attempts") == [
            ("running", 5, 1, "w")]
    finally:
        store.close()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


# --- the write path ----------------------------------------------------------------------------


def test_every_event_of_every_partition_lands_once_in_typed_columns(
    r: redis.Redis, store: Store
) -> None:
    ids = produce(r, 200)
    sid = emit(r, "2-JX", "failed", r="2-JX@1700000000000", a="3", t="1700000000123", w="w-9",
               d="250", ty="report", q="slow", s="1700000000000", err="boom\x00end", f="7",
               at="1700000001000", zz="unknown field", )
    emit(r, "3-JY", "dispatched", a="not-a-number", t="99999999999999999999999")
    a = archiver(r, store, batch=64)
    assert a.lag().entries == 602
    assert drain(a) == 602
    assert len(stored(store)) == 602
    assert set(ids) <= set(stored(store))
    assert stream_lengths(r) == [0] * PARTITIONS  # acknowledged and trimmed
    assert a.lag().entries == 0 and a.lag().seconds == 0
    ms, seq = sid.split("-")
    [row] = store.fetchall(
        "SELECT part, event, job_id, run_id, attempt, ts_ms, worker, duration_ms, job_type, queue, "
        "sched_ms, error, result, fence, retry_at_ms, extra FROM events "
        "WHERE sid_ms = ? AND sid_seq = ? AND part = 2", [int(ms), int(seq)])
    assert tuple(row) == (2, "failed", "2-JX", "2-JX@1700000000000", 3, 1700000000123, "w-9", 250,
                          "report", "slow", 1700000000000, "boom\ufffdend", None, 7,
                          1700000001000, '{"zz": "unknown field"}')
    [(attempt, ts, extra)] = store.fetchall(
        "SELECT attempt, ts_ms, extra FROM events WHERE job_id = '3-JY'")
    assert (attempt, ts) == (None, None)  # malformed numbers are kept as text, never fail a batch
    assert json.loads(extra) == {"a": "not-a-number", "t": "99999999999999999999999"}


TRICKY: list[dict[EncodableT, EncodableT]] = [  # all bytes, typed as XADD takes them
    {b"e": b"succeeded", b"j": b"0-A", b"r": b"0-A@1700000000000", b"a": b"1", b"t": b"17",
     b"res": b'{"ok":true}', b"ty": b"email"},  # plain: the fast COPY line
    {b"e": b"failed", b"j": b"0-B", b"r": b"0-B@17", b"err": "caf\u00e9 \u65e5\u672c".encode()},
    {b"e": b"failed", b"j": b"0-C", b"err": b"tab\there\nnew line\r\\ back\\slash"},
    {b"e": b"failed", b"j": b"0-D", b"err": b"bad \xff\xfe utf-8 and NUL \x00 end"},
    {b"e": b"started", b"j": b"0-E", b"a": b"-3", b"t": b"0042", b"d": b"", b"w": b""},
    {b"e": b"started", b"j": b"0-F", b"a": b"99999999999999999999", b"r": b"0-F@x1"},
    {b"e": b"started", b"j": b"0-G", b"new_field": b"kept in extra", b"s": b"5"},
    {b"j": b"0-H"},  # no event name at all
    # As the engine writes run events: job id and scheduled time only in the run id, and the
    # start carried by the outcome of a run started and finished in one report.
    {b"e": b"succeeded", b"r": b"0-I@1700000000000", b"a": b"1", b"t": b"20", b"w": b"w-1",
     b"st": b"15", b"f": b"1", b"res": b"null"},
]


def test_every_kind_of_field_value_is_stored_exactly_as_decoded(
    r: redis.Redis, store: Store
) -> None:
    """The Postgres COPY fast path and the careful decode give the same rows as SQLite's."""
    from rsched.archive._copy import fast_line, row_line
    from rsched.archive.events import decode_flat

    for fields in TRICKY:
        r.xadd(keys.events(0), fields)
    entries = [(0, sid, [x for kv in f.items() for x in kv])
               for sid, f in xrange(r, keys.events(0))]
    plain = fast_line(b"0", entries[0][1], entries[0][2])
    assert plain is not None and plain == row_line(decode_flat(*entries[0]))
    assert fast_line(b"0", entries[1][1], entries[1][2]) is not None  # UTF-8 is plain too
    assert all(fast_line(b"0", e[1], e[2]) is None for e in entries[2:7])
    assert fast_line(b"0", entries[7][1], entries[7][2]) == row_line(decode_flat(*entries[7]))
    run_event = decode_flat(*entries[8])
    assert fast_line(b"0", entries[8][1], entries[8][2]) == row_line(run_event)
    assert (run_event.job_id, run_event.sched_ms, run_event.started_ms, run_event.fence) == (
        "0-I", 1_700_000_000_000, 15, 1)
    drain(archiver(r, store))
    got = [tuple(row) for row in store.fetchall(
        "SELECT * FROM events ORDER BY sid_ms, sid_seq, part")]
    want = [tuple(decode_flat(*e)) for e in entries]
    assert got == want
    assert want[3][13] == "bad \ufffd\ufffd utf-8 and NUL \ufffd end"
    assert want[2][13] == "tab\there\nnew line\r\\ back\\slash"
    assert (want[4][6], want[4][7], want[4][8]) == (-3, 42, None)
    assert (want[5][6], want[5][12]) == (None, None)
    assert isinstance(want[5][17], str) and json.loads(want[5][17]) == {"a": "99999999999999999999"}
    assert isinstance(want[6][17], str)
    assert json.loads(want[6][17]) == {"new_field": "kept in extra"}
    assert want[6][12] == 5
    assert want[7][3] == ""


def test_a_batch_committed_but_never_acknowledged_is_not_written_twice(
    r: redis.Redis, store: Store
) -> None:
    produce(r, 100)
    crashed = archiver(r, store, batch=1000)
    batch = crashed.read()  # an archiver reads a batch, commits it, and dies before XACK
    assert crashed.commit(batch) == 300
    assert r.xpending(keys.events(0), keys.EVENTS_GROUP)["pending"] > 0

    # Restarted under the same id: it reads its own pending entries back first.
    again = Archiver(r, store, PARTITIONS, ArchiverConfig(), consumer=crashed.consumer)
    res = again.run_once()
    assert (res.read, res.inserted) == (300, 0)
    assert len(stored(store)) == 300 and stream_lengths(r) == [0] * PARTITIONS
    assert again.totals["duplicates"] == 300


def test_another_archiver_claims_what_a_dead_one_left_pending(
    r: redis.Redis, store: Store
) -> None:
    ids = produce(r, 60)
    dead = archiver(r, store, batch=10)
    dead.commit(dead.read())  # committed 40, died before XACK
    live = archiver(r, store, batch=1000, claim_idle_ms=1)
    time.sleep(0.01)
    assert live.claim_once() == 40
    res = live.run_once()
    assert (res.read, res.inserted) == (40, 0)
    drain(live)
    assert stored(store) == ids
    assert [r.xpending(keys.events(p), keys.EVENTS_GROUP)["pending"] for p in range(PARTITIONS)] \
        == [0] * PARTITIONS
    assert stream_lengths(r) == [0] * PARTITIONS


def test_trimming_keeps_everything_from_the_oldest_entry_another_archiver_still_holds(
    r: redis.Redis, store: Store
) -> None:
    produce(r, 40)
    slow = archiver(r, store, batch=5)
    held = slow.read()  # 5 entries per partition, pending under the slow archiver
    fast = archiver(r, store, batch=1000)
    drain(fast)
    assert len(stored(store)) == 120 - 20
    # The slow archiver's entries are the oldest of each stream: nothing at or after them goes.
    for p in range(PARTITIONS):
        oldest = xrange(r, keys.events(p), count=1)[0][0]
        assert oldest == held.ids[p][0]
    assert sum(stream_lengths(r)) == 120
    slow.run_once()  # commits the batch it held
    fast.run_once()  # nothing new; the next trim after the slow XACK empties the streams
    assert len(stored(store)) == 120
    assert sum(stream_lengths(r)) <= 20
    produce(r, 4)
    drain(fast)
    assert stream_lengths(r) == [0] * PARTITIONS


def test_several_archivers_at_once_write_every_event_exactly_once(
    redis_url: str, r: redis.Redis, store: Store, archive_url: str
) -> None:
    expected = produce(r, 300)
    stop = threading.Event()
    stores = [open_store(archive_url) for _ in range(3)]
    workers = [archiver(redis.Redis.from_url(redis_url), s, batch=25) for s in stores]
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for t in threads:
        t.start()
    try:
        for _ in range(5):  # the engine keeps writing while they run
            expected += produce(r, 100)
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while len(stored(store)) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for w, s in zip(workers, stores, strict=True):
            w.r.close()
            s.close()
    assert stored(store) == sorted(expected)
    assert sum(w.totals["inserted"] for w in workers) == len(expected)
    assert sum(1 for w in workers if w.totals["inserted"]) >= 2  # the work was shared


def test_events_older_than_the_retention_are_acknowledged_but_not_written(
    r: redis.Redis, store: Store
) -> None:
    old = redis_now_ms(r) - 40 * DAY_MS
    emit(r, "1-OLD", "succeeded", sid=f"{old}-0", t=old)
    emit(r, "1-NEW", "succeeded", t=old)
    a = archiver(r, store, retention_days=30)
    res = a.run_once()
    assert (res.read, res.inserted, res.skipped_old) == (2, 1, 1)
    assert [job for (job,) in store.fetchall("SELECT job_id FROM events")] == ["1-NEW"]
    assert stream_lengths(r) == [0] * PARTITIONS


def test_retention_drops_whole_days_of_old_history(r: redis.Redis, store: Store) -> None:
    now = redis_now_ms(r)
    day = now // DAY_MS
    for back in (45, 31, 29, 0):
        ms = (day - back) * DAY_MS + 1000
        emit(r, "1-R", "succeeded", sid=f"{ms}-0", t=ms)
    drain(archiver(r, store, retention_days=0))  # keep everything while writing
    assert len(stored(store)) == 4
    if store.dialect == "postgres":
        tables = {name for (name,) in store.fetchall(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'events'::regclass")}
        assert {partition_name(day - b) for b in (45, 31, 29, 0)} <= tables
    dropped = archiver(r, store, retention_days=30).retention_once()
    kept = sorted(ms // DAY_MS for ms, _, _ in stored(store))
    assert kept == [day - 29, day]
    if store.dialect == "postgres":
        assert dropped >= 2
        tables = {name for (name,) in store.fetchall(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'events'::regclass")}
        assert partition_name(day - 45) not in tables and partition_name(day - 31) not in tables
        assert partition_name(day - 29) in tables
    else:
        assert dropped == 2


def test_lag_counts_waiting_events_and_the_age_of_the_oldest(
    r: redis.Redis, store: Store
) -> None:
    a = archiver(r, store, batch=2)
    assert a.lag().entries == 0
    past = redis_now_ms(r) - 5000
    for i in range(6):
        emit(r, "0-L", "succeeded", sid=f"{past + i}-0", t=past)
    emit(r, "1-L", "succeeded")
    lag = a.lag()
    assert lag.entries == 7 and lag.by_partition[0] == 6 and lag.pending == 0
    assert 5 <= lag.seconds < 60
    a.read()  # delivered, not acknowledged: still waiting
    lag = a.lag()
    assert (lag.entries, lag.pending) == (7, 3)
    assert 5 <= lag.seconds < 60
    a.run_once()  # commits the batch read above, and reads the next one while it commits
    lag = a.lag()
    assert (lag.entries, lag.pending) == (4, 2)
    assert 5 <= lag.seconds < 60  # entries 3..5 of partition 0 are as old
    drain(a)
    assert a.lag().entries == 0


def test_an_unavailable_store_keeps_events_in_redis_warns_and_catches_up(
    r: redis.Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's outage: its directory is missing (the Postgres one is in the chaos tests)."""
    missing = tmp_path / "not-yet"
    store = open_store(f"sqlite:///{missing}/archive.db")
    a = Archiver(r, store, PARTITIONS, ArchiverConfig(
        poll_ms=10, backlog_warn=50, backoff_base_ms=20, backoff_cap_ms=100))
    stop = threading.Event()
    thread = threading.Thread(target=a.run, args=(stop,))
    expected = produce(r, 40)
    with caplog.at_level(logging.WARNING, logger="rsched.archive"):
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while a.backoff.failures < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert a.backoff.failures >= 4  # retried, with capped delays
            expected += produce(r, 10)
            assert redis_ids(r) == sorted(expected)  # everything still waits in Redis
            missing.mkdir()
            while a.lag().entries and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            thread.join(10)
    assert stored(store) == sorted(expected)
    assert stream_lengths(r) == [0] * PARTITIONS
    assert any("archive store unavailable" in m and "events wait in Redis" in m
               for m in caplog.messages)
    assert any("archive backlog" in m for m in caplog.messages)
    store.close()


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


# --- configuration -----------------------------------------------------------------------------


def test_the_archive_url_selects_the_store_and_a_bad_one_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sqlite_path("sqlite:///var/lib/rsched/a.db") == "/var/lib/rsched/a.db"
    assert sqlite_path("sqlite:////var/lib/rsched/a.db") == "/var/lib/rsched/a.db"
    assert sqlite_path("sqlite:archive.db") == "archive.db"
    assert open_store("postgresql://u:pw@db:5432/rsched").dialect == "postgres"
    assert open_store(f"sqlite:///{tmp_path}/x.db").dialect == "sqlite"
    monkeypatch.setenv("RSCHED_ARCHIVE_URL", f"sqlite:///{tmp_path}/env.db")
    assert open_store().dialect == "sqlite"
    for bad in ("mysql://u:secret@db/x", "sqlite://host/x.db", "sqlite:///", "nonsense"):
        with pytest.raises(ValidationError) as info:
            open_store(bad)
        assert info.value.field == "RSCHED_ARCHIVE_URL"
        assert "secret" not in str(info.value)
    assert redact("postgresql://u:secret@db:5432/x") == "postgresql://u:***@db:5432/x"


def test_archiver_settings_come_from_the_environment_and_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RSCHED_ARCHIVE_BATCH", "123")
    monkeypatch.setenv("RSCHED_ARCHIVE_RETENTION_DAYS", "7")
    config = ArchiverConfig.from_env(url="sqlite:x.db", retention_days=9)
    assert (config.batch, config.retention_days, config.url) == (123, 9, "sqlite:x.db")
    monkeypatch.setenv("RSCHED_ARCHIVE_BATCH", "lots")
    with pytest.raises(ValidationError) as info:
        ArchiverConfig.from_env()
    assert info.value.field == "RSCHED_ARCHIVE_BATCH"
    monkeypatch.setenv("RSCHED_ARCHIVE_BATCH", "0")
    with pytest.raises(ValidationError) as info:
        ArchiverConfig.from_env()
    assert info.value.field == "RSCHED_ARCHIVE_BATCH"


def test_a_store_that_cannot_be_reached_raises_store_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        open_store(f"sqlite:///{tmp_path}/missing/dir/a.db").connect()
    with pytest.raises(StoreUnavailable) as info:
        open_store("postgresql://u:secret@127.0.0.1:1/x?connect_timeout=2").connect()
    assert "u:***@127.0.0.1:1" in str(info.value) and "secret" not in str(info.value)


def test_a_postgres_archive_without_psycopg_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ImportError
    monkeypatch.delitem(sys.modules, "rsched.archive.postgres", raising=False)
    with pytest.raises(ValidationError) as e:
        open_store("postgresql://127.0.0.1/db")
    assert e.value.field == "RSCHED_ARCHIVE_URL" and "rsched[postgres]" in e.value.reason
