"""SQLite archive store: the embedded default for one machine and ``rsched dev``.

WAL journal with ``synchronous=FULL``: a committed batch survives a power cut, which the archiver
relies on before it acknowledges the batch in Redis.  Several processes may share the file;
SQLite serializes their writes (``BEGIN IMMEDIATE`` waits up to the busy timeout).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rsched.archive.events import COLUMNS, Entry, decode_flat
from rsched.archive.job_index import JOB_COLUMNS, JobChanges
from rsched.archive.store import (
    JOBS_CONFLICT,
    PRIMARY_KEY,
    SCHEMA_MIGRATIONS,
    Prepared,
    Store,
    StoreUnavailable,
    pending_migrations,
)

BUSY_TIMEOUT_S = 30.0
DELETE_CHUNK = 20_000  # rows per retention transaction: writers wait at most one chunk
_INSERT = (f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
           "ON CONFLICT DO NOTHING")
_UPSERT_JOBS = (f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(JOB_COLUMNS))}) {JOBS_CONFLICT}")
_DELETE_JOBS = "DELETE FROM jobs WHERE job_id = ? AND (sid_ms, sid_seq) < (?, ?)"


def statements(script: str) -> Iterator[str]:
    """Split a migration into statements the way SQLite's own tokenizer sees them."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            yield buf.strip()
            buf = ""
    rest = [ln for ln in buf.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    if rest:
        raise ValueError(f"incomplete SQL statement at the end of a migration: {buf.strip()!r}")


class SqliteStore(Store):
    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        super().__init__(f"sqlite:///{path.lstrip('/')}" if path.startswith("/") else
                         f"sqlite:{path}")
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def connect(self) -> None:
        with self._lock:
            if self._conn is not None:
                return
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                                       check_same_thread=False)
            except sqlite3.Error as e:
                raise StoreUnavailable(f"sqlite {self.path}: {e}") from e
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                self._migrate(conn)
            except sqlite3.Error as e:
                conn.close()
                raise StoreUnavailable(f"sqlite {self.path}: {e}") from e
            self._conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        with _transaction(conn):
            conn.execute(SCHEMA_MIGRATIONS)
            applied = conn.execute("SELECT version FROM schema_migrations").fetchall()
            for m in pending_migrations(self.dialect, applied):
                for statement in statements(m.sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                             (m.version, m.name, int(time.time() * 1000)))

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _conn_or_raise(self) -> sqlite3.Connection:
        self.connect()
        assert self._conn is not None
        return self._conn

    def prepare(self, entries: Sequence[Entry]) -> Prepared:
        return Prepared(len(entries), [decode_flat(part, sid, flat) for part, sid, flat in entries])

    def commit(self, prepared: Prepared, jobs: JobChanges | None = None) -> int:
        if not prepared.rows:
            return 0
        return self._write(_INSERT, prepared.payload, jobs)

    def drop_before(self, cutoff_ms: int) -> int:
        """Delete events appended before ``cutoff_ms`` in chunks; returns rows deleted."""
        total = 0
        while True:
            with self._lock:
                conn = self._conn_or_raise()
                try:
                    with _transaction(conn):
                        n = conn.execute(
                            "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events "
                            "WHERE sid_ms < ? LIMIT ?)", (cutoff_ms, DELETE_CHUNK)).rowcount
                except sqlite3.Error as e:
                    self._reset()
                    raise StoreUnavailable(f"sqlite {self.path}: {e}") from e
            total += n
            if n < DELETE_CHUNK:
                return total

    def _write(self, statement: str, rows: Sequence[Sequence[Any]],
               jobs: JobChanges | None = None) -> int:
        """One executemany in one transaction, with a batch's job-index changes; returns the
        rows ``statement`` changed."""
        with self._lock:
            conn = self._conn_or_raise()
            try:
                with _transaction(conn):
                    before = conn.total_changes
                    conn.executemany(statement, rows)
                    changed = conn.total_changes - before
                    if jobs is not None:
                        conn.executemany(_UPSERT_JOBS, jobs.rows)
                        conn.executemany(_DELETE_JOBS, jobs.gone)
                    return changed
            except sqlite3.Error as e:
                self._reset()
                raise StoreUnavailable(f"sqlite {self.path}: {e}") from e

    def _page_sql(self, column: str, order: str, filters: list[str], keyset: list[str],
                  via: str | None) -> str:
        """SQLite reads the index the plan names (INDEXED BY): without STAT4 its statistics
        know a column's average rows per value, and its own plan for a rare type sorted by next
        run walked the sort's index through the whole table."""
        conds = " AND ".join(filters + keyset) or "1 = 1"
        if via == PRIMARY_KEY:
            via = "sqlite_autoindex_jobs_1"  # job_id TEXT PRIMARY KEY's
        return (f"SELECT {column}, job_id FROM jobs {f'INDEXED BY {via}' if via else ''} "
                f"WHERE {conds} ORDER BY {column} {order}, job_id {order} LIMIT ?")

    def _fetch(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self._conn_or_raise()
            try:
                return conn.execute(query, list(params)).fetchall()
            except sqlite3.OperationalError as e:
                if "syntax error" in str(e) or "no such" in str(e):
                    raise
                self._reset()
                raise StoreUnavailable(f"sqlite {self.path}: {e}") from e


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (the connection is in autocommit)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
