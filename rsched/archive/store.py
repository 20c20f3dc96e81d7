"""The archive store: where events land (Postgres or SQLite), chosen by ``RSCHED_ARCHIVE_URL``.

Both stores share the schema's shape (versioned migrations shipped in ``migrations/``), the row
identity that makes redelivery harmless, and every read query; they differ in how a batch goes
in (COPY through a staging table vs. one executemany), how schema changes are serialized between
processes, and how retention drops old history (whole day partitions vs. a range delete).
"""

from __future__ import annotations

import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from rsched.archive.events import COLUMNS, FAILURES, Entry, EventRow
from rsched.archive.job_index import JOB_COLUMNS, JobChanges, JobRow
from rsched.core.errors import RschedError, ValidationError

ENV_URL = "RSCHED_ARCHIVE_URL"
DEFAULT_URL = "sqlite:rsched-archive.db"
"""Embedded default: a SQLite file in the working directory (one machine, ``rsched dev``)."""

DAY_MS = 86_400_000
_MIGRATION = re.compile(r"^(\d{4})_(\w+?)(?:\.(postgres|sqlite))?\.sql$")


class StoreUnavailable(RschedError):
    """The archive database cannot be reached or refused a batch; the caller retries later."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect: str) -> list[Migration]:
    """``migrations/NNNN_name[.dialect].sql`` for this dialect, by version (package data)."""
    found: dict[int, Migration] = {}
    for entry in resources.files("rsched.archive").joinpath("migrations").iterdir():
        m = _MIGRATION.match(entry.name)
        if not m or m.group(3) not in (None, dialect):
            continue
        version = int(m.group(1))
        if version in found:
            raise RuntimeError(f"two migrations with version {version}: {entry.name}")
        found[version] = Migration(version, m.group(2), entry.read_text())
    return [found[v] for v in sorted(found)]


SCHEMA_MIGRATIONS = ("CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                     "name text NOT NULL, applied_ms bigint NOT NULL)")
"""Versions applied to this database (both dialects); created before the first migration."""


def pending_migrations(dialect: str, applied: Iterable[tuple[Any, ...]]) -> list[Migration]:
    """The migrations not in ``applied`` (rows of ``SELECT version FROM schema_migrations``)."""
    done = {int(row[0]) for row in applied}
    return [m for m in migrations(dialect) if m.version not in done]


def redact(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def sqlite_path(url: str) -> str:
    """``sqlite:///abs/path.db`` (or ``sqlite:////abs/path.db``) -> absolute; ``sqlite:rel.db``."""
    parts = urlsplit(url)
    path = parts.path
    if parts.netloc or not path or path == "/":
        raise ValidationError(ENV_URL, f"expected sqlite:///path/to/file.db, got {url!r}")
    return "/" + path.lstrip("/") if path.startswith("/") else path


def archive_url(url: str | None = None) -> str:
    """The URL given, else ``RSCHED_ARCHIVE_URL``, else the embedded SQLite default."""
    return url or os.environ.get(ENV_URL) or DEFAULT_URL


_SELECT = ", ".join(COLUMNS)
_FAILURES = ", ".join(f"'{e}'" for e in FAILURES)
# rank >= q * n in integers (q in millionths): floats would round differently in the two stores.
_QUANTILE_CASE = "min(CASE WHEN rn * 1000000 >= {q} * n THEN duration_ms END)"


_JOB_COLS = ", ".join(JOB_COLUMNS)
_JOB_SET = ", ".join(f"{c} = excluded.{c}" for c in JOB_COLUMNS[1:] if c != "idem_key")
JOBS_CONFLICT = (f"ON CONFLICT (job_id) DO UPDATE SET {_JOB_SET}, "
                 "idem_key = coalesce(excluded.idem_key, jobs.idem_key) "
                 "WHERE (jobs.sid_ms, jobs.sid_seq) < (excluded.sid_ms, excluded.sid_seq)")
"""A job row replaces the stored one only for a later event of the job (both dialects)."""
SET_MARK = ("INSERT INTO job_index_meta (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value")
INSERT_JOBS = (f"INSERT INTO jobs ({_JOB_COLS}) VALUES ({', '.join('?' * len(JOB_COLUMNS))}) "
               "ON CONFLICT (job_id) DO NOTHING")
DROP_JOB = "DELETE FROM jobs WHERE job_id = ? AND sid_ms = ? AND sid_seq = ?"

SORTS = {"nextRun": ("next_ms", False), "created": ("created_ms", True),
         "lastRun": ("last_run_ms", True)}
"""A listing's sort -> (column, descending): soonest next run first, newest first, latest
run first; each with job_id (in the same direction) breaking ties."""
_PREFIX_COLUMNS = ("job_id", "job_type", "idem_key")
# The index (migrations/0005_jobs) whose first column each filter and prefix reads.
_FILTER_INDEX = {"job_type": "jobs_type", "queue": "jobs_queue", "status": "jobs_status"}
PRIMARY_KEY = "jobs_pkey"  # Postgres's name; SQLite's is its own (SqliteStore)
_PREFIX_INDEX = {"job_id": PRIMARY_KEY, "job_type": "jobs_type", "idem_key": "jobs_idem"}
SORT_INDEX = {"nextRun": "jobs_next", "created": "jobs_created", "lastRun": "jobs_last"}
PLAN_ROWS = 20_000
"""A filter sorted by next or last run sorts its matches when fewer match (Store._plan)."""


class Term(NamedTuple):
    """One condition of a listing: the index that reads it, its SQL
    (``?`` placeholders) and parameters; ``equal`` for one value (its index then holds its
    matches in creation order), False for a prefix's range."""

    via: str
    sql: str
    params: list[Any]
    equal: bool = True


_MAX_CHAR = 0x10FFFF


@dataclass(frozen=True, slots=True)
class JobQuery:
    """What a listing asks the job index for: rows equal on every field given; ``last_run``
    any of these latest-run statuses; ``prefix`` a prefix of the job id, type or
    idempotency key."""

    job_type: str | None = None
    queue: str | None = None
    status: str | None = None
    last_run: tuple[str, ...] | None = None
    prefix: str | None = None


def _prefix_range(column: str, prefix: str) -> tuple[str, list[Any]]:
    """``column`` starts with ``prefix``, as a range of an index (text compared by code
    point: the Postgres columns are COLLATE "C", SQLite's BINARY is too)."""
    if prefix[-1] == chr(_MAX_CHAR):
        return f"{column} >= ? AND substr({column}, 1, ?) = ?", [prefix, len(prefix), prefix]
    return f"{column} >= ? AND {column} < ?", [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A batch encoded for one store: ``rows`` events in the store's own ``payload``."""

    rows: int
    payload: Any = None


class Store(ABC):
    """One connection, used under a lock (the API may call from several threads)."""

    dialect: str

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.RLock()

    # --- connection and schema ---------------------------------------------------------------

    @abstractmethod
    def connect(self) -> None:
        """Open the connection if needed and apply pending migrations; StoreUnavailable on error."""

    @abstractmethod
    def _reset(self) -> None:
        """Close the connection (errors ignored), forget what it knew; the next call reconnects."""

    def close(self) -> None:
        with self._lock:
            self._reset()

    @abstractmethod
    def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read query (``?`` placeholders); StoreUnavailable on a database error."""

    def applied_migrations(self) -> list[int]:
        return [int(v) for (v,) in self._fetch("SELECT version FROM schema_migrations ORDER BY 1")]

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Ad-hoc read query for operators and tests (``?`` placeholders in both dialects)."""
        return self._fetch(sql, params)

    # --- write path --------------------------------------------------------------------------

    @abstractmethod
    def prepare(self, entries: Sequence[Entry]) -> Prepared:
        """Turn entries into what ``commit`` sends (no I/O: the archiver prepares the next batch
        while the store commits the current one)."""

    @abstractmethod
    def commit(self, prepared: Prepared, jobs: JobChanges | None = None) -> int:
        """Insert the rows in one transaction, skipping ids already present, with the batch's
        changes to the job index; returns the number of rows inserted."""

    def write(self, entries: Sequence[Entry], jobs: JobChanges | None = None) -> int:
        """prepare + commit."""
        return self.commit(self.prepare(entries), jobs)

    @abstractmethod
    def drop_before(self, cutoff_ms: int) -> int:
        """Retention: forget events appended before ``cutoff_ms``; returns days (rows) dropped."""

    # --- read path ---------------------------------------------------------------------------

    def job_scheds(self, job_id: str, max_sched_ms: int | None, n: int) -> list[int]:
        """The ``n`` latest distinct run times of the job up to ``max_sched_ms``, newest first."""
        bound = "" if max_sched_ms is None else "AND sched_ms <= ?"
        params: list[Any] = [job_id] + ([] if max_sched_ms is None else [max_sched_ms])
        rows = self._fetch(
            f"SELECT DISTINCT sched_ms FROM events WHERE job_id = ? AND sched_ms IS NOT NULL "
            f"AND run_id IS NOT NULL {bound} ORDER BY sched_ms DESC LIMIT ?", [*params, n])
        return [int(s) for (s,) in rows]

    def job_events(self, job_id: str, lo_sched_ms: int | None, hi_sched_ms: int | None
                   ) -> list[EventRow]:
        """Every run event of the job with ``lo <= sched_ms <= hi`` (None: unbounded)."""
        where = ["job_id = ?", "run_id IS NOT NULL"]
        params: list[Any] = [job_id]
        if lo_sched_ms is not None:
            where.append("sched_ms >= ?")
            params.append(lo_sched_ms)
        if hi_sched_ms is not None:
            where.append("sched_ms <= ?")
            params.append(hi_sched_ms)
        sql = f"SELECT {_SELECT} FROM events WHERE {' AND '.join(where)} ORDER BY sid_ms, sid_seq"
        return [EventRow(*row) for row in self._fetch(sql, params)]

    def failures(self, job_type: str | None, since_ms: int, until_ms: int,
                 before: tuple[int, int, int] | None, limit: int) -> list[EventRow]:
        """Failed, timed-out and abandoned attempts with ``since <= ts < until``, newest first.

        ``before`` = (ts_ms, sid_ms, sid_seq) of the last row of the previous page.
        """
        where = [f"event IN ({_FAILURES})", "ts_ms >= ?", "ts_ms < ?"]
        params: list[Any] = [since_ms, until_ms]
        if job_type is not None:
            where.append("job_type = ?")
            params.append(job_type)
        if before is not None:
            where.append("(ts_ms, sid_ms, sid_seq) < (?, ?, ?)")
            params += list(before)
        sql = (f"SELECT {_SELECT} FROM events WHERE {' AND '.join(where)} "
               "ORDER BY ts_ms DESC, sid_ms DESC, sid_seq DESC LIMIT ?")
        return [EventRow(*row) for row in self._fetch(sql, [*params, limit])]

    def durations(self, since_ms: int, until_ms: int, job_type: str | None,
                  quantiles: Sequence[float]) -> list[tuple[Any, ...]]:
        """Per job type: count, failed count, mean, max and nearest-rank quantiles of duration_ms.

        Nearest rank (the value at rank ceil(q * n)), the definition of Postgres's percentile_disc,
        written with window functions so both stores compute exactly the same numbers.
        """
        where = ["duration_ms IS NOT NULL", "ts_ms >= ?", "ts_ms < ?"]
        params: list[Any] = [since_ms, until_ms]
        if job_type is not None:
            where.append("job_type = ?")
            params.append(job_type)
        qs = ", ".join(_QUANTILE_CASE.format(q=round(q * 1_000_000)) for q in quantiles)
        sql = (
            "SELECT job_type, count(*), sum(CASE WHEN event <> 'succeeded' THEN 1 ELSE 0 END), "
            f"CAST(avg(duration_ms) AS DOUBLE PRECISION), max(duration_ms), {qs} FROM ("
            "  SELECT jt AS job_type, event, duration_ms,"
            "    row_number() OVER (PARTITION BY jt ORDER BY duration_ms) AS rn,"
            "    count(*) OVER (PARTITION BY jt) AS n"
            "  FROM (SELECT coalesce(job_type, '') AS jt, event, duration_ms FROM events"
            f"    WHERE {' AND '.join(where)}) f"
            ") d GROUP BY job_type ORDER BY job_type"
        )
        return self._fetch(sql, params)

    def job_keys(self, query: JobQuery, sort: str, after: tuple[int, str] | None, limit: int
                 ) -> list[tuple[int, str]]:
        """The next ``limit`` (sort key, job id) of the job index matching ``query`` after
        ``after`` in the order of ``sort`` (a SORTS key).  Each branch (a latest-run status,
        a prefix column) is one query; branches merge here."""
        column, desc = SORTS[sort]
        terms: list[Term] = [Term(_FILTER_INDEX[name], f"{name} = ?", [getattr(query, name)])
                             for name in ("job_type", "queue", "status")
                             if getattr(query, name) is not None]
        branches: list[list[Term]] = [[]]
        if query.last_run is not None:
            branches = [[Term("jobs_lastrun", "last_run_status = ?", [s])]
                        for s in query.last_run]
        if query.prefix:
            ranges = [Term(_PREFIX_INDEX[c], *_prefix_range(c, query.prefix), equal=False)
                      for c in _PREFIX_COLUMNS]
            branches = [b + [r] for b in branches for r in ranges]
        keyset: list[str] = []
        key_params: list[Any] = []
        if after is not None:
            keyset.append(f"({column}, job_id) {'<' if desc else '>'} (?, ?)")
            key_params += list(after)
        order = "DESC" if desc else "ASC"
        found: set[tuple[int, str]] = set()
        for branch in branches:
            filters = terms + branch
            via = self._plan(sort, filters)
            sql = self._page_sql(column, order, [t.sql for t in filters], keyset, via)
            rows = self._fetch(sql, [*(p for t in filters for p in t.params), *key_params, limit])
            found.update((int(k), str(j)) for k, j in rows)
        return sorted(found, reverse=desc)[:limit]

    def _plan(self, sort: str, filters: list[Term]) -> str | None:
        """The index a filtered page reads when its order is not its filter index's own (sorted
        by next or last run, or a prefix by creation): its filter's (the one with the fewest
        matches), whose matches are then sorted, when fewer than PLAN_ROWS match; else the
        sort's, skipping the rows that do not match.  Each filter's matches
        are counted up to PLAN_ROWS, from its index alone.  Neither store's statistics tell a
        rare value from a common one well enough to choose every time (Postgres's estimate
        moved with the cursor at 10M rows: a page now and then walked millions of rows).  None:
        the query as it is (by creation, an equal filter's index is in order already)."""
        if not filters or (sort == "created" and any(t.equal for t in filters)):
            return None
        counts = []
        for t in filters:
            (n,) = self._fetch(f"SELECT count(*) FROM (SELECT 1 FROM jobs WHERE {t.sql} "
                               f"LIMIT {PLAN_ROWS}) c", t.params)[0]
            counts.append((int(n), t.via))
        fewest, via = min(counts)
        return via if fewest < PLAN_ROWS else SORT_INDEX[sort]

    def _page_sql(self, column: str, order: str, filters: list[str], keyset: list[str],
                  via: str | None) -> str:
        """A page's query (parameters: the filters', the keyset's, then the limit) reading
        ``via``: a filter's matches as a subquery the planner keeps apart (OFFSET 0), then
        sorted, or the sort's index, which the planner walks by itself."""
        if via is None or via in SORT_INDEX.values():
            conds = " AND ".join(filters + keyset) or "1 = 1"
            return (f"SELECT {column}, job_id FROM jobs WHERE {conds} "
                    f"ORDER BY {column} {order}, job_id {order} LIMIT ?")
        # The keyset outside: inside, it let Postgres walk the sort's index again.
        after = " AND ".join(keyset) or "1 = 1"
        return (f"SELECT {column}, job_id FROM (SELECT {column}, job_id FROM jobs "
                f"WHERE {' AND '.join(filters)} OFFSET 0) m WHERE {after} "
                f"ORDER BY {column} {order}, job_id {order} LIMIT ?")

    # --- the job index's housekeeping (job_index.IndexScan, job_index.IndexSweep) -------------

    @abstractmethod
    def _write(self, statement: str, rows: Sequence[Sequence[Any]]) -> int:
        """One statement (``?`` placeholders) for each of ``rows``, in one transaction;
        returns rows changed."""

    def add_jobs(self, rows: Sequence[JobRow]) -> int:
        """Insert rows for jobs the index has none of (a row there stays); returns inserted."""
        return self._write(INSERT_JOBS, rows) if rows else 0

    def drop_jobs(self, rows: Sequence[tuple[str, int, int]]) -> int:
        """Delete the rows (job id, sid_ms, sid_seq) still as read (no later event applied)."""
        return self._write(DROP_JOB, rows) if rows else 0

    def job_ids_after(self, job_id: str, n: int) -> list[tuple[str, int, int, int]]:
        """The next ``n`` rows by job id after ``job_id``: (job id, part, sid_ms, sid_seq)."""
        return [(str(j), int(p), int(ms), int(seq)) for j, p, ms, seq in self._fetch(
            "SELECT job_id, part, sid_ms, sid_seq FROM jobs WHERE job_id > ? ORDER BY job_id "
            "LIMIT ?", [job_id, n])]

    def job_index_mark(self, name: str) -> int | None:
        rows = self._fetch("SELECT value FROM job_index_meta WHERE name = ?", [name])
        return int(rows[0][0]) if rows else None

    def set_job_index_mark(self, name: str, value: int) -> None:
        """Keep ``value`` under ``name`` in job_index_meta."""
        self._write(SET_MARK, [(name, value)])

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DAY_MS", "DEFAULT_URL", "DROP_JOB", "ENV_URL", "INSERT_JOBS", "JOBS_CONFLICT",
           "JobQuery", "Migration", "PLAN_ROWS", "PRIMARY_KEY", "Prepared", "SET_MARK", "SORTS",
           "SORT_INDEX", "Store", "StoreUnavailable", "Term", "archive_url", "migrations",
           "redact", "sqlite_path"]
