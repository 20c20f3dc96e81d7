"""Job listings as every face shows them: from the archive's job index when one is configured
and the listing filters, searches or sorts, else the SCAN of listings.op_list_jobs, which says
so (``indexed`` False).

An indexed page reads the next rows of the index in the order asked (keyset: the cursor is the
last row read, never an offset), then the listed jobs' current state from Redis, and keeps the
jobs that still match: what is shown is never staler than one round trip.  A row whose job no
longer matches in Redis (changed or gone since the archiver last applied its events) is left
out and the page reads on, so every page is full until the last.  A walk lists each job that
matches both in the index and in Redis exactly once, as long as its sort key stays (creation
never changes; a job's next run and last run move as it runs, so a walk by those may show a job
that ran meanwhile twice or not at all).  A job changed after ``indexed_until_ms`` may be
listed by its state before that change, or missed until the archiver catches up.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from rsched.archive.lag import op_archive_lag
from rsched.archive.store import SORTS, JobQuery, Store
from rsched.core import defaults
from rsched.core.cursor import check_limit, decode_cursor, encode_cursor, is_int64_key
from rsched.core.errors import ValidationError
from rsched.core.last_run import LastRun, check_filter, filter_statuses
from rsched.core.models import Job, JobStatus, partition_of
from rsched.rdb import keys
from rsched.rdb.job_reads import op_hashes
from rsched.rdb.ops import Blocking, Op
from rsched.service.context import Service
from rsched.service.last_runs import op_last_runs
from rsched.service.listings import op_list_jobs

DEFAULT_SORT = "created"
MAX_QUERY_CHARS = 200
MAX_ROUNDS = 8
"""Index reads per page at most: a page comes back short (with a cursor) only when more than
that many reads in a row found rows whose jobs no longer match in Redis."""


@dataclass(frozen=True, slots=True)
class JobFilter:
    status: str | None = None
    type: str | None = None
    queue: str | None = None
    last_run: str | None = None
    q: str | None = None  # a prefix of the job id, type or idempotency key

    def check(self) -> JobFilter:
        check_filter(self.last_run)
        if self.status is not None and self.status not in {s.value for s in JobStatus}:
            raise ValidationError("status", "must be one of "
                                  + ", ".join(s.value for s in JobStatus))
        if self.q is not None and not 1 <= len(self.q) <= MAX_QUERY_CHARS:
            raise ValidationError("q", f"must be 1 to {MAX_QUERY_CHARS} characters")
        for name in ("type", "queue"):
            if getattr(self, name) == "":
                raise ValidationError(name, "must not be empty")
        return self

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.status, self.type, self.queue, self.last_run,
                                           self.q))

    def query(self) -> JobQuery:
        return JobQuery(self.type, self.queue, self.status,
                        None if self.last_run is None else filter_statuses(self.last_run),
                        self.q)

    def matches(self, job: Job, last: LastRun) -> bool:
        """Whether the job, as Redis holds it now, matches."""
        q = self.q
        return ((self.status is None or job.status.value == self.status)
                and (self.type is None or job.type == self.type)
                and (self.queue is None or job.queue == self.queue)
                and (self.last_run is None or last.matches(self.last_run))
                and (q is None or job.id.startswith(q) or job.type.startswith(q)
                     or (job.idempotency_key or "").startswith(q)))


@dataclass(frozen=True, slots=True)
class Listing:
    jobs: list[Job]
    last_runs: list[LastRun]
    next_cursor: str | None
    indexed: bool
    """Read from the job index (sorted, keyset-paged); False: the SCAN, in no order."""
    sort: str | None = None
    indexed_until_ms: int | None = None
    """The index holds every change made before this time (Redis's clock)."""


def _is_position(sort: str) -> Any:
    def check(v: Any) -> bool:
        return (isinstance(v, list) and len(v) == 3 and v[0] == sort
                and is_int64_key(v[1:2], 1) and isinstance(v[2], str))
    return check


def check_sort(sort: str | None) -> str | None:
    if sort is not None and sort not in SORTS:
        raise ValidationError("sort", "must be one of " + ", ".join(SORTS))
    return sort


def op_job_listing(svc: Service, flt: JobFilter, *, sort: str | None = None,
                   limit: int = defaults.PAGE_LIMIT, cursor: str | None = None) -> Op[Listing]:
    """One page of jobs matching ``flt``: indexed when an archive is configured and the
    listing filters, searches or sorts; see the module docstring."""
    check_limit(limit)
    flt.check()
    check_sort(sort)
    store = svc.archive
    if store is None or not (flt.given or sort is not None):
        if flt.q is not None:
            raise ValidationError("q", "search reads the job index, kept in the run-history "
                                  "archive: this API has none (RSCHED_ARCHIVE_URL)")
        page = yield from op_list_jobs(status=flt.status, type=flt.type, queue=flt.queue,
                                       limit=limit, cursor=cursor, last_run=flt.last_run)
        last = yield from op_last_runs(page.items)
        return Listing(page.items, last, page.next_cursor, indexed=False)
    sort = sort or DEFAULT_SORT
    pos = decode_cursor(cursor, _is_position(sort))
    after: tuple[int, str] | None = None if pos is None else (pos[1], pos[2])
    lag = yield from op_archive_lag((yield from svc.op_partitions()))
    jobs, lasts, more = yield from _read_page(store, flt, sort, after, limit)
    return Listing(jobs, lasts, None if more is None else encode_cursor([sort, *more]),
                   indexed=True, sort=sort, indexed_until_ms=lag.applied_until_ms)


def _read_page(store: Store, flt: JobFilter, sort: str, after: tuple[int, str] | None,
               limit: int) -> Op[tuple[list[Job], list[LastRun], tuple[int, str] | None]]:
    """Index rows after ``after``, checked against Redis, until ``limit`` jobs match; returns
    them and the last row read when more may follow (None: the end)."""
    query = flt.query()
    jobs: list[Job] = []
    lasts: list[LastRun] = []
    for _ in range(MAX_ROUNDS):
        want = limit - len(jobs)
        # One row beyond the page tells whether another page follows.
        rows = yield Blocking(partial(store.job_keys, query, sort, after, want + 1))
        read = rows[:want]
        if not read:
            return jobs, lasts, None
        hashes = yield from op_hashes([keys.job(partition_of(j), j) for _, j in read])
        found = [Job.from_hash(h, j) for (_, j), h in zip(read, hashes, strict=True) if h]
        for job, last in zip(found, (yield from op_last_runs(found)), strict=True):
            if flt.matches(job, last):
                jobs.append(job)
                lasts.append(last)
        after = read[-1]
        if len(rows) <= want:
            return jobs, lasts, None
        if len(jobs) == limit:
            return jobs, lasts, after
    return jobs, lasts, after


__all__ = ["DEFAULT_SORT", "JobFilter", "Listing", "check_sort", "op_job_listing"]
