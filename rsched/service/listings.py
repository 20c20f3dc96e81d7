"""Job listings and dead-letter pages, as operations either client runs (``client.run(op)``);
run history is in history.py, the cluster's status in status.py.

Listing jobs has no index to use: jobs are found with SCAN over ``rsched:{p*}:job:*`` and
filtered with one HMGET of status, type and queue per key, so a page costs O(keys scanned), not
O(page).  One request scans at most LIST_MAX_SCANS x LIST_SCAN_COUNT hash-table buckets of the
whole keyspace (jobs, runs, history lists...) and then returns what it found with a cursor, so a
rare filter over a large keyspace returns short pages rather than one slow request; walking all
pages visits the keyspace once.  SCAN may return a key twice while Redis resizes its table, so a
listing may repeat a job, and lists jobs in no particular order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsched.core import defaults
from rsched.core.cursor import check_limit, decode_cursor, encode_cursor
from rsched.core.errors import ValidationError
from rsched.core.layout import STATUS_DEFAULT
from rsched.core.models import Job, JobStatus, Run
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.job_reads import op_dead_after, op_hashes, op_job_filter_fields, op_scan_jobs
from rsched.rdb.ops import Masters, Op
from rsched.service.context import Service
from rsched.service.dead_letters import DeadFilter
from rsched.service.jobs import op_read_runs
from rsched.service.last_runs import check_filter as check_last_run
from rsched.service.last_runs import op_last_runs

LIST_SCAN_COUNT = 500
LIST_MAX_SCANS = 20


def is_count(v: Any) -> bool:
    """A cursor's offset: a non-negative integer (JSON true is no integer)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# --- jobs --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Any]
    next_cursor: str | None


# What a job hash without the field holds, in the filter's order (status, type, queue).
_ABSENT = (STATUS_DEFAULT, None, defaults.QUEUE)


def op_list_jobs(
    *,
    status: str | None = None,
    type: str | None = None,
    queue: str | None = None,
    limit: int = defaults.PAGE_LIMIT,
    cursor: str | None = None,
    last_run: str | None = None,
) -> Op[Page]:
    """One page of jobs matching every filter given; see the module docstring for the cost.
    ``last_run`` (failed, dead, succeeded) also reads each candidate's latest run."""
    check_limit(limit)
    check_last_run(last_run)
    if status is not None and status not in {s.value for s in JobStatus}:
        raise ValidationError("status", "must be one of " + ", ".join(s.value for s in JobStatus))
    state = decode_cursor(cursor, lambda v: isinstance(v, list) and len(v) == 3
                          and is_count(v[0]) and is_count(v[1]) and isinstance(v[2], str))
    node, scan_at, after = state if state else (0, 0, "")
    masters = yield Masters()
    if node >= masters:
        raise ValidationError("cursor", "not a cursor of this Redis (fewer masters now)")
    want = [(i, v) for i, v in enumerate((status, type, queue)) if v is not None]
    jobs: list[Job] = []
    for _ in range(LIST_MAX_SCANS):
        batch_at = scan_at
        scan_at, names = yield from op_scan_jobs(batch_at, LIST_SCAN_COUNT,
                                                 node if masters > 1 else None)
        if after:
            names, after = [n for n in names if n > after], ""
        if want and names:
            vals = yield from op_job_filter_fields(names)
            # A job hash always has its type; status and queue are left out at their default.
            names = [n for n, v in zip(names, vals, strict=True) if v[1] is not None
                     and all(as_text(v[i]) == w if v[i] is not None else _ABSENT[i] == w
                             for i, w in want)]
        if last_run is not None and names:
            found_jobs = yield from _with_last_run(names, last_run)
            names = list(found_jobs)
        take = names[: limit - len(jobs)]
        if take and last_run is not None:
            jobs += [found_jobs[n] for n in take]
        elif take:
            hashes = yield from op_hashes(take)
            jobs += [Job.from_hash(h, keys.job_id_of(n))
                     for n, h in zip(take, hashes, strict=True) if h]
        if len(take) < len(names):
            return Page(jobs, encode_cursor([node, batch_at, take[-1]]))
        if scan_at == 0:  # this master is done: the next one, or the end
            if node + 1 >= masters:
                return Page(jobs, None)
            node += 1
        if len(jobs) >= limit:
            break
    return Page(jobs, encode_cursor([node, scan_at, ""]))


def _with_last_run(names: list[str], wanted: str) -> Op[dict[str, Job]]:
    """The jobs (by key, in order) among ``names`` whose latest run is as ``wanted``."""
    hashes = yield from op_hashes(names)
    found = [(n, Job.from_hash(h, keys.job_id_of(n)))
             for n, h in zip(names, hashes, strict=True) if h]
    last = yield from op_last_runs([j for _, j in found])
    return {n: j for (n, j), lr in zip(found, last, strict=True) if lr.matches(wanted)}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    run: Run
    dead_ms: int


def _is_letter(v: Any) -> bool:
    """A dead-letter cursor: the last letter shown, [dead ms, run id]."""
    return (isinstance(v, list) and len(v) == 2 and type(v[0]) in (int, float)
            and isinstance(v[1], str) and v[1] != "")


def op_dead_letter_page(svc: Service, limit: int = defaults.PAGE_LIMIT,
                        cursor: str | None = None, flt: DeadFilter | None = None) -> Op[Page]:
    """Dead letters across partitions, most recent first (ties by run id, descending); the
    cursor is the last letter shown, so a walk lists every letter that stays once, whatever
    is dead-lettered or deleted meanwhile.  With a filter, a page holds the matches among the
    next ``limit`` letters: it may be short, even empty, with a cursor for more."""
    check_limit(limit)
    P = yield from svc.op_partitions()
    last = decode_cursor(cursor, _is_letter)
    after = None if last is None else (float(last[0]), last[1])
    top = None
    if after is None and flt is not None and flt.older_than_s is not None:
        top = flt.max_score((yield from svc.op_now()))
    entries = yield from op_dead_after(P, after, top, limit)
    entries.sort(key=lambda e: (e[1], e[0]), reverse=True)
    taken = entries[:limit]
    runs = yield from op_read_runs([rid for rid, _ in taken])
    items = [DeadLetter(run, int(score)) for (_, score), run in zip(taken, runs, strict=True)
             if run is not None and (flt is None or flt.matches(run))]
    if len(taken) < limit:
        return Page(items, None)
    rid, score = taken[-1]
    return Page(items, encode_cursor([int(score) if score.is_integer() else score, rid]))
