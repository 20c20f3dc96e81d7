"""The run-history archive's write side against a real redis-server and both stores (SQLite and
Postgres): migrations, the archiver's batches (exactly once, claims of a dead archiver's
pending entries, trimming, retention, lag, an unavailable store), and configuration.

Every behaviour test runs twice, once per store (``archive_url``, tests/support/archive.py);
Postgres tests get a schema of their own in the session's database.  The archiver is driven one
batch at a time (``run_once``, ``claim_once``); the crash and outage tests with real processes
are in tests/processes/test_archive_chaos.py; the read side is in test_archive_reads.py.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
import redis
from redis.typing import EncodableT
from support import archive as archive_support
from support.archive import (
    PARTITIONS,
    archiver,
    drain,
    emit,
    produce,
    redis_ids,
    stored,
    stream_lengths,
)
from support.helpers import (
    redis_now_ms,
    xrange,
)

from rsched import ValidationError
from rsched.archive import (
    Archiver,
    ArchiverConfig,
    Store,
    StoreUnavailable,
    open_store,
)
from rsched.archive.postgres import partition_name
from rsched.archive.store import DAY_MS, SCHEMA_MIGRATIONS, migrations, redact, sqlite_path
from rsched.rdb import keys

archive_url, store = archive_support.archive_url, archive_support.store  # fixtures, by name


# --- schema ------------------------------------------------------------------------------------


def test_migrations_ship_in_the_package_for_both_dialects() -> None:
    for dialect in ("postgres", "sqlite"):
        found = migrations(dialect)
        assert [(m.version, m.name) for m in found] == [
            (1, "events"), (2, "run_attempts"), (3, "started_ms"), (4, "run_attempts_started"),
            (5, "jobs")]
        assert "CREATE TABLE events" in found[0].sql and "CREATE VIEW run_attempts" in found[1].sql
    assert "PARTITION BY RANGE (sid_ms)" in migrations("postgres")[0].sql


def test_migrations_are_applied_on_start_once_and_recorded(archive_url: str) -> None:
    first = open_store(archive_url)
    second = open_store(archive_url)
    try:
        first.connect()
        assert first.applied_migrations() == [1, 2, 3, 4, 5]
        second.connect()  # a second archiver starting later applies nothing again
        assert second.applied_migrations() == [1, 2, 3, 4, 5]
        rows = second.fetchall("SELECT version, name FROM schema_migrations ORDER BY version")
        assert [tuple(row) for row in rows] == [
            (1, "events"), (2, "run_attempts"), (3, "started_ms"), (4, "run_attempts_started"),
            (5, "jobs")]
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
        assert stores[0].applied_migrations() == [1, 2, 3, 4, 5]
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
        assert store.applied_migrations() == [1, 2, 3, 4, 5]
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
