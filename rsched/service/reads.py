"""The read path: job listings and dead-letter pages, cron previews and Redis health, as
operations either client runs (``client.run(op)``); run history is in history.py, the cluster's
status in status.py.

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
from datetime import datetime
from typing import Any

from rsched.core import defaults
from rsched.core.cron import parse_cron, validate_zone
from rsched.core.cursor import check_limit, decode_cursor, encode_cursor
from rsched.core.errors import NotFound, ScheduleError, ValidationError
from rsched.core.models import Job, JobStatus, Run, job_of_run, partition_of
from rsched.core.times import ms_to_iso
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, cmd
from rsched.rdb.setup import SAFE_POLICIES
from rsched.service.context import Service
from rsched.service.dead_letters import DeadFilter
from rsched.service.jobs import op_read_runs
from rsched.service.last_runs import check_filter as check_last_run
from rsched.service.last_runs import op_last_runs

LIST_SCAN_COUNT = 500
LIST_MAX_SCANS = 20
MAX_PREVIEW = 100
PREVIEW_MIN_MS = 0
PREVIEW_MAX_MS = 7_258_118_400_000  # 2200-01-01: cron walks stay far from datetime's year 9999


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def is_count(v: Any) -> bool:
    """A cursor's offset: a non-negative integer (JSON true is no integer)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# --- jobs --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Any]
    next_cursor: str | None


def op_list_jobs(
    *,
    status: str | None = None,
    type: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    last_run: str | None = None,
) -> Op[Page]:
    """One page of jobs matching every filter given; see the module docstring for the cost.
    ``last_run`` (failed, dead, succeeded) also reads each candidate's latest run."""
    check_limit(limit)
    check_last_run(last_run)
    if status is not None and status not in {s.value for s in JobStatus}:
        raise ValidationError("status", "must be one of " + ", ".join(s.value for s in JobStatus))
    state = decode_cursor(cursor, lambda v: isinstance(v, list) and len(v) == 2
                          and is_count(v[0]) and isinstance(v[1], str))
    scan_at, after = state if state else (0, "")
    want = [(i, v) for i, v in enumerate((status, type, queue)) if v is not None]
    jobs: list[Job] = []
    for _ in range(LIST_MAX_SCANS):
        batch_at = scan_at
        ((scan_at, found),) = yield Commands([
            cmd("scan", batch_at, match=keys.job_pattern(), count=LIST_SCAN_COUNT)
        ])
        names = sorted({_s(n) for n in found})
        if after:
            names, after = [n for n in names if n > after], ""
        if want and names:
            vals = yield Commands([cmd("hmget", n, "status", "type", "queue") for n in names])
            names = [n for n, v in zip(names, vals, strict=True)
                     if all(v[i] is not None and _s(v[i]) == w for i, w in want)]
        if last_run is not None and names:
            found_jobs = yield from _with_last_run(names, last_run)
            names = list(found_jobs)
        take = names[: limit - len(jobs)]
        if take and last_run is not None:
            jobs += [found_jobs[n] for n in take]
        elif take:
            hashes = yield Commands([cmd("hgetall", n) for n in take])
            jobs += [Job.from_hash(h) for h in hashes if h]
        if len(take) < len(names):
            return Page(jobs, encode_cursor([batch_at, take[-1]]))
        if scan_at == 0:
            return Page(jobs, None)
        if len(jobs) >= limit:
            break
    return Page(jobs, encode_cursor([scan_at, ""]))


def _with_last_run(names: list[str], wanted: str) -> Op[dict[str, Job]]:
    """The jobs (by key, in order) among ``names`` whose latest run is as ``wanted``."""
    hashes = yield Commands([cmd("hgetall", n) for n in names])
    found = [(n, Job.from_hash(h)) for n, h in zip(names, hashes, strict=True) if h]
    last = yield from op_last_runs([j for _, j in found])
    return {n: j for (n, j), lr in zip(found, last, strict=True) if lr.matches(wanted)}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    run: Run
    dead_ms: int


def op_dead_letter_page(svc: Service, limit: int = 50, cursor: str | None = None,
                        flt: DeadFilter | None = None) -> Op[Page]:
    """Dead letters across partitions, most recent first; the cursor holds per-partition offsets
    (a letter dead-lettered while paging may show up twice; a replayed one may shift a page).
    With a filter, a page holds the matches among the next ``limit`` letters: it may be short,
    even empty, with a cursor for more."""
    check_limit(limit)
    P = yield from svc.op_partitions()
    offsets = decode_cursor(cursor, lambda v: isinstance(v, list) and len(v) == P
                            and all(is_count(x) for x in v)) or [0] * P
    if flt is not None and flt.older_than_s is not None:
        top = flt.max_score((yield from svc.op_now()))
        reads = [cmd("zrevrangebyscore", keys.dead(p), top, "-inf", start=off, num=limit,
                     withscores=True) for p, off in enumerate(offsets)]
    else:
        reads = [cmd("zrevrange", keys.dead(p), off, off + limit - 1, withscores=True)
                 for p, off in enumerate(offsets)]
    res = yield Commands(reads)
    entries = sorted(((score, _s(rid), p) for p, r in enumerate(res) for rid, score in r),
                     key=lambda e: (-e[0], e[1]))
    taken = entries[:limit]
    more = len(entries) > len(taken) or any(len(r) == limit for r in res)
    runs = yield from op_read_runs([rid for _, rid, _ in taken])
    for _, _, p in taken:
        offsets[p] += 1
    items = [DeadLetter(run, int(score)) for (score, _, _), run in zip(taken, runs, strict=True)
             if run is not None and (flt is None or flt.matches(run))]
    return Page(items, encode_cursor(offsets) if more and taken else None)


# --- cron preview ------------------------------------------------------------------------------


def preview(cron: Any, tz: Any, from_ms: int, count: Any) -> list[dict[str, str]]:
    """The next `count` fire times after `from_ms`, in UTC and in the job's zone."""
    if not isinstance(cron, str):
        raise ValidationError("cron", "required: a cron expression such as '30 2 * * *'")
    if not isinstance(tz, str):
        raise ValidationError("timeZone", "must be an IANA time zone such as 'Europe/Berlin'")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PREVIEW:
        raise ValidationError("count", f"must be an integer between 1 and {MAX_PREVIEW}")
    if not PREVIEW_MIN_MS <= from_ms <= PREVIEW_MAX_MS:
        raise ValidationError("from", "must be between 1970 and 2200")
    schedule = parse_cron(cron, tz)
    zone = validate_zone(tz)
    times: list[dict[str, str]] = []
    at = from_ms
    for _ in range(count):
        try:
            at = schedule.next_after(at)
        except (ScheduleError, OverflowError, ValueError):
            if not times:
                raise ScheduleError("cron", "no fire time within 50 years") from None
            break  # the calendar ran out (a rare date far ahead): return what there is
        times.append({"utc": ms_to_iso(at) or "",
                      "local": datetime.fromtimestamp(at / 1000, zone).isoformat()})
    return times


# --- Redis health ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    level: str  # ok | warn | fail
    message: str


def op_redis_facts() -> Op[dict[str, Any]]:
    """What `doctor` and /readyz judge: version, eviction policy, AOF, fsync, partitions."""
    res = yield Commands([
        cmd("info", "server"), cmd("config_get", "maxmemory-policy"),
        cmd("config_get", "appendonly"), cmd("config_get", "appendfsync"),
        cmd("hget", keys.config(), "partitions"),
    ], raise_on_error=False)

    def conf(i: int, name: str) -> str | None:
        return None if isinstance(res[i], Exception) else _s(res[i].get(name, "")) or None

    info = res[0] if isinstance(res[0], dict) else {}
    parts = res[4]
    return {
        "version": str(info.get("redis_version", "")) or None,
        "maxmemory-policy": conf(1, "maxmemory-policy"),
        "appendonly": conf(2, "appendonly"),
        "appendfsync": conf(3, "appendfsync"),
        "partitions": int(parts) if isinstance(parts, (bytes, str, int)) else None,
    }


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def doctor(facts: dict[str, Any], wanted_partitions: int = 0) -> list[Finding]:
    """Judge the facts; every finding that is not ok says what to change."""
    out: list[Finding] = []
    v = facts.get("version")
    if v is None:
        out.append(Finding("version", "warn", "cannot read the Redis version (INFO disabled?)"))
    elif _version(v) < (6, 2):
        out.append(Finding("version", "fail", f"Redis {v} lacks XAUTOCLAIM: upgrade to 6.2+"))
    else:
        out.append(Finding("version", "ok", f"Redis {v}"))
    pol = facts.get("maxmemory-policy")
    if pol is None:
        out.append(Finding("maxmemory-policy", "warn",
                           "cannot read it (CONFIG disabled?): make sure it is noeviction"))
    elif pol not in SAFE_POLICIES:
        out.append(Finding("maxmemory-policy", "fail", f"{pol} lets Redis evict jobs: "
                           "CONFIG SET maxmemory-policy noeviction (and in redis.conf)"))
    else:
        out.append(Finding("maxmemory-policy", "ok", pol))
    aof, fsync = facts.get("appendonly"), facts.get("appendfsync")
    if aof != "yes":
        out.append(Finding("appendonly", "warn", f"AOF is {aof or 'unknown'}: a Redis crash loses "
                           "recent jobs; set appendonly yes"))
    else:
        out.append(Finding("appendonly", "ok", "yes"))
    if fsync not in ("everysec", "always"):
        out.append(Finding("appendfsync", "warn", f"appendfsync is {fsync or 'unknown'}: set "
                           "appendfsync everysec (loses at most a second of writes)"))
    else:
        out.append(Finding("appendfsync", "ok", fsync))
    stored = facts.get("partitions")
    if stored is None:
        out.append(Finding("partitions", "warn", "not set yet: the first rsched process stores "
                           f"{wanted_partitions or defaults.PARTITIONS} (RSCHED_PARTITIONS)"))
    elif wanted_partitions and stored != wanted_partitions:
        out.append(Finding("partitions", "fail", f"Redis holds {stored} partitions, this "
                           f"process wants {wanted_partitions}: set RSCHED_PARTITIONS={stored}"))
    else:
        out.append(Finding("partitions", "ok", str(stored)))
    return out


def job_id_or_404(job_id: str) -> str:
    """A path's job id, as NotFound when it cannot be one (no partition prefix)."""
    try:
        partition_of(job_id)
    except ValidationError:
        raise NotFound("job", job_id) from None
    return job_id


def run_id_or_404(run_id: str) -> str:
    """A path's run id, as NotFound when it cannot be one."""
    try:
        if "@" not in run_id:
            raise ValidationError("runId", "no @")
        partition_of(job_of_run(run_id))
    except ValidationError:
        raise NotFound("dead letter", run_id) from None
    return run_id
