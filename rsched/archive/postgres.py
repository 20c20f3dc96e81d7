"""Postgres archive store: COPY, and ON CONFLICT DO NOTHING for a batch seen before.

Fast path: COPY the batch straight into ``events`` (about twice the staging route's throughput:
loadtest/bench_archive.py). A batch holding an event already archived (an archiver killed between
commit and XACK, a batch claimed from a stalled archiver) fails that COPY on the primary key; it is
then COPYed into a temporary staging table and moved with INSERT ... ON CONFLICT DO NOTHING, which
skips exactly the rows already present. Either way a batch is one transaction, and its COPY data
(text format) is built from the bytes Redis sent (see _copy.py).

``events`` is partitioned by day of the stream entry time; a batch first makes sure its days
exist (under an advisory lock, so several archivers never race on CREATE TABLE), and retention
drops whole day partitions, which costs the same for a thousand rows or a billion.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from rsched.archive._copy import copy_text
from rsched.archive.events import COLUMNS, Entry, parse_sid
from rsched.archive.job_index import JOB_COLUMNS, JobChanges
from rsched.archive.store import (
    DAY_MS,
    JOBS_CONFLICT,
    SCHEMA_MIGRATIONS,
    Prepared,
    Store,
    StoreUnavailable,
    pending_migrations,
    redact,
)

# One advisory lock for schema changes (migrations, day partitions) of this database.
LOCK_KEY = zlib.crc32(b"rsched.archive") & 0x7FFFFFFF
_COLS = ", ".join(COLUMNS)
_COPY = f"COPY events ({_COLS}) FROM STDIN"
_COPY_STAGE = f"COPY events_stage ({_COLS}) FROM STDIN"
_INSERT = f"INSERT INTO events ({_COLS}) SELECT {_COLS} FROM events_stage ON CONFLICT DO NOTHING"
_JOB_COLS = ", ".join(JOB_COLUMNS)
_COPY_JOBS = f"COPY jobs_stage ({_JOB_COLS}) FROM STDIN"
_UPSERT_JOBS = (f"INSERT INTO jobs ({_JOB_COLS}) SELECT {_JOB_COLS} FROM jobs_stage "
                f"ORDER BY job_id {JOBS_CONFLICT}")  # one lock order for concurrent archivers
_DELETE_JOBS = ("DELETE FROM jobs j USING unnest(%s::text[], %s::bigint[], %s::bigint[]) "
                "AS d(job_id, sid_ms, sid_seq) WHERE j.job_id = d.job_id "
                "AND (j.sid_ms, j.sid_seq) < (d.sid_ms, d.sid_seq)")
_PREFIX = "events_d"
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def partition_name(day: int) -> str:
    """Day number (days since the epoch, UTC) -> ``events_dYYYYMMDD``."""
    return _PREFIX + datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y%m%d")


def partition_day(name: str) -> int | None:
    if not name.startswith(_PREFIX):
        return None
    try:
        stamp = datetime.strptime(name[len(_PREFIX):], "%Y%m%d").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(stamp.timestamp()) // 86_400


def _copy(cur: psycopg.Cursor[Any], statement: str, data: bytes) -> None:
    with cur.copy(statement) as copy:
        copy.write(data)


def _write_jobs(cur: psycopg.Cursor[Any], jobs: JobChanges | None) -> None:
    """The batch's job-index changes, in the batch's transaction (see job_index)."""
    if jobs is None:
        return
    if jobs.rows:
        with cur.copy(_COPY_JOBS) as copy:
            for row in jobs.rows:
                copy.write_row(row)
        cur.execute(_UPSERT_JOBS)
    if jobs.gone:
        gone = sorted(jobs.gone)
        cur.execute(_DELETE_JOBS, ([g[0] for g in gone], [g[1] for g in gone],
                                   [g[2] for g in gone]))


class PostgresStore(Store):
    dialect = "postgres"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._days: set[int] = set()

    # --- connection and schema ---------------------------------------------------------------

    def connect(self) -> None:
        with self._lock:
            if self._conn is not None and not self._conn.closed:
                return
            try:
                conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                                       client_encoding="utf8")  # COPY data is UTF-8 bytes
            except psycopg.Error as e:
                raise StoreUnavailable(f"postgres {redact(self.url)}: {e}".strip()) from e
            try:
                self._migrate(conn)
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS events_stage (LIKE events) "
                             "ON COMMIT DELETE ROWS")
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS jobs_stage (LIKE jobs) "
                             "ON COMMIT DELETE ROWS")
                self._days = self._existing_days(conn)
            except psycopg.Error as e:
                conn.close()
                raise StoreUnavailable(f"postgres {redact(self.url)}: {e}".strip()) from e
            self._conn = conn

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Apply pending migrations in one transaction, serialized across processes."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            conn.execute(SCHEMA_MIGRATIONS)
            applied = conn.execute("SELECT version FROM schema_migrations")
            for m in pending_migrations(self.dialect, applied):
                conn.execute(m.sql.encode())  # bytes: no placeholder parsing, several statements
                conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, %s)",
                             (m.version, m.name, int(time.time() * 1000)))

    def _children(self, conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
        rows = conn.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = "
                            "i.inhrelid WHERE i.inhparent = 'events'::regclass").fetchall()
        return [(name, day) for (name,) in rows if (day := partition_day(name)) is not None]

    def _existing_days(self, conn: psycopg.Connection[Any]) -> set[int]:
        return {day for _, day in self._children(conn)}

    def _ensure_days(self, conn: psycopg.Connection[Any], days: Iterable[int]) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            for day in sorted(days):
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} PARTITION OF events FOR VALUES FROM ({}) TO ({})"
                ).format(sql.Identifier(partition_name(day)), day * DAY_MS, (day + 1) * DAY_MS))
                self._days.add(day)

    def _reset(self) -> None:
        conn, self._conn, self._days = self._conn, None, set()
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    # --- write path --------------------------------------------------------------------------

    def prepare(self, entries: Sequence[Entry]) -> Prepared:
        """COPY data, and the day partitions it needs."""
        days = frozenset(parse_sid(sid)[0] // DAY_MS for _, sid, _ in entries)
        return Prepared(len(entries), (copy_text(entries), days) if entries else None)

    def commit(self, prepared: Prepared, jobs: JobChanges | None = None) -> int:
        if not prepared.rows:
            return 0
        data, days = prepared.payload
        with self._lock:
            self.connect()
            conn = self._conn
            assert conn is not None
            try:
                if days - self._days:
                    self._ensure_days(conn, days - self._days)
                try:
                    with conn.transaction(), conn.cursor() as cur:
                        _copy(cur, _COPY, data)
                        _write_jobs(cur, jobs)
                    return prepared.rows
                except psycopg.errors.UniqueViolation:
                    pass  # some rows were archived before: the slow path skips exactly those
                with conn.transaction(), conn.cursor() as cur:
                    _copy(cur, _COPY_STAGE, data)
                    cur.execute(_INSERT)
                    inserted = max(cur.rowcount, 0)
                    _write_jobs(cur, jobs)
                    return inserted
            except psycopg.Error as e:
                self._reset()  # a dropped day or a dead connection: start from scratch
                raise StoreUnavailable(f"postgres {redact(self.url)}: {e}".strip()) from e

    def drop_before(self, cutoff_ms: int) -> int:
        """Drop every day partition that ends at or before ``cutoff_ms``; returns days dropped."""
        with self._lock:
            self.connect()
            conn = self._conn
            assert conn is not None
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                    old = [(n, d) for n, d in self._children(conn) if (d + 1) * DAY_MS <= cutoff_ms]
                    for name, day in old:
                        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
                        self._days.discard(day)
                return len(old)
            except psycopg.Error as e:
                self._reset()
                raise StoreUnavailable(f"postgres {redact(self.url)}: {e}".strip()) from e

    def _write(self, statement: str, rows: Sequence[Sequence[Any]]) -> int:
        """One executemany in one transaction; rows changed."""
        with self._lock:
            self.connect()
            conn = self._conn
            assert conn is not None
            try:
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(statement.replace("?", "%s"), rows)
                    return max(cur.rowcount, 0)
            except psycopg.Error as e:
                self._reset()
                raise StoreUnavailable(f"postgres {redact(self.url)}: {e}".strip()) from e

    # --- read path ---------------------------------------------------------------------------

    def _fetch(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            self.connect()
            assert self._conn is not None
            try:
                return self._conn.execute(query.replace("?", "%s"), list(params)).fetchall()
            except _CONNECTION_ERRORS as e:
                self._reset()
                raise StoreUnavailable(f"postgres {redact(self.url)}: {e}".strip()) from e
