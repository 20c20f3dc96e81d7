"""A job's run history, from the archive when one is configured, else from Redis alone.

The choice is made here once (``history_of``): the clients' ``runs``, GET /jobs/{id}/runs and
`rsched jobs runs` all ask the source it returns.  Redis keeps the in-flight run and a bounded
list of finished attempts; the archive keeps every attempt, merged with the events Redis has not
handed over yet (rsched.archive.history).
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

from rsched.archive import history
from rsched.archive.history import RunAttempt, RunsPage
from rsched.core import defaults
from rsched.core.cursor import MAX_PAGE, check_limit, decode_cursor, encode_cursor
from rsched.core.models import Attempt
from rsched.rdb.event_streams import op_recent
from rsched.rdb.ops import Blocking, Op
from rsched.service.context import Service
from rsched.service.jobs import INFLIGHT_STATES, attempt_key, op_get, op_runs
from rsched.service.listings import Page, is_count


def op_history(svc: Service, job_id: str, limit: int = defaults.PAGE_LIMIT,
               cursor: str | None = None, *, max_scan: int | None = None) -> Op[RunsPage]:
    """A page of the job's attempts, newest first: the archive's and those whose events are
    still only in Redis's stream, each once (rsched.archive.history).  NotFound when neither
    knows the job and Redis has no such job."""
    history.check_page(limit, cursor)
    scan = history.scan_recent(job_id, max_scan or history.DEFAULT_MAX_SCAN)
    try:
        key, top, count = next(scan)
        while True:
            key, top, count = scan.send((yield from op_recent(key, top, count)))
    except StopIteration as done:
        recent, partial_ = done.value
    store = svc.archive
    read = partial(history.runs_page, store, job_id, recent, partial_, limit, cursor)
    page: RunsPage = (yield Blocking(read)) if store is not None else read()
    if not page.items and not cursor:
        yield from op_get(job_id)
    return page


_NEWEST = 2**63 - 1  # an ended ms above every attempt's


def _is_attempt_key(v: object) -> bool:
    return (isinstance(v, list) and len(v) == 3 and is_count(v[0]) and is_count(v[1])
            and isinstance(v[2], str))


def op_redis_runs_page(job_id: str, limit: int = defaults.PAGE_LIMIT,
                       cursor: str | None = None) -> Op[Page]:
    """A job's attempts from Redis, newest first: the in-flight one (first page), then finished
    ones.  The cursor is the last finished attempt shown (jobs.attempt_key), so attempts that
    finish while a client pages shift nothing: each attempt Redis keeps is listed once."""
    check_limit(limit)
    last = decode_cursor(cursor, _is_attempt_key)
    after = None if last is None else (last[0], last[1], last[2])
    got: list[Attempt] = yield from op_runs(job_id, limit + 1, after=after)
    page = got[:limit]
    if len(got) <= limit:
        return Page(page, None)
    done = [a for a in page if a.status not in INFLIGHT_STATES]
    # A page of the in-flight attempt alone: the next one starts at the newest finished.
    return Page(page, encode_cursor(list(attempt_key(done[-1])) if done else [_NEWEST, 0, ""]))


class RedisHistory:
    """Redis's own bounded history: no archive configured."""

    archived = False

    def op_page(self, job_id: str, limit: int = defaults.PAGE_LIMIT,
                cursor: str | None = None) -> Op[Page]:
        return (yield from op_redis_runs_page(job_id, limit, cursor))

    def op_attempts(self, job_id: str, limit: int = defaults.PAGE_LIMIT,
                    offset: int = 0) -> Op[list[Attempt]]:
        return (yield from op_runs(job_id, limit, offset))


class ArchiveHistory:
    """Every attempt: the archive's, merged with the events still only in Redis."""

    archived = True

    def __init__(self, svc: Service) -> None:
        self.svc = svc

    def op_page(self, job_id: str, limit: int = defaults.PAGE_LIMIT,
                cursor: str | None = None) -> Op[RunsPage]:
        return (yield from op_history(self.svc, job_id, limit, cursor))

    def op_attempts(self, job_id: str, limit: int = defaults.PAGE_LIMIT, offset: int = 0
                    ) -> Op[list[RunAttempt]]:
        """Pages of op_history walked from the newest until ``offset + limit`` attempts."""
        out: list[RunAttempt] = []
        cursor = None
        while len(out) < offset + limit:
            page = yield from op_history(self.svc, job_id,
                                         min(MAX_PAGE, offset + limit - len(out)), cursor)
            out += page.items
            cursor = page.next_cursor
            if cursor is None:
                break
        return out[offset:offset + limit]


class HistorySource(Protocol):
    """What the faces and the clients' ``runs`` read a job's history through."""

    archived: bool

    def op_page(self, job_id: str, limit: int = defaults.PAGE_LIMIT, cursor: str | None = None
                ) -> Op[Page | RunsPage]: ...

    def op_attempts(self, job_id: str, limit: int = defaults.PAGE_LIMIT, offset: int = 0
                    ) -> Op[list[Attempt] | list[RunAttempt]]: ...


def history_of(svc: Service) -> HistorySource:
    """The history source every face reads: the archive's when one is configured."""
    return ArchiveHistory(svc) if svc.archive_url else RedisHistory()


# RunAttempt and RunsPage re-exported: the clients and faces name a history's types from here,
# not from the archive (only the service reads it).
__all__ = ["ArchiveHistory", "HistorySource", "RedisHistory", "RunAttempt", "RunsPage",
           "history_of", "op_history", "op_redis_runs_page"]
