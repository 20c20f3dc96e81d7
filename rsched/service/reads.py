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
from rsched.core.layout import STATUS_DEFAULT
from rsched.core.lifecycle import skip_reason
from rsched.core.models import Job, JobStatus, Run, job_of_run, partition_of
from rsched.core.times import ms_to_iso
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.job_reads import op_dead_pages, op_hashes, op_job_filter_fields, op_scan_jobs
from rsched.rdb.ops import Masters, Op
from rsched.rdb.redis_facts import op_read_facts
from rsched.rdb.setup import SAFE_POLICIES, replicas_short
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


def op_dead_letter_page(svc: Service, limit: int = defaults.PAGE_LIMIT,
                        cursor: str | None = None, flt: DeadFilter | None = None) -> Op[Page]:
    """Dead letters across partitions, most recent first; the cursor holds per-partition offsets
    (a letter dead-lettered while paging may show up twice; a replayed one may shift a page).
    With a filter, a page holds the matches among the next ``limit`` letters: it may be short,
    even empty, with a cursor for more."""
    check_limit(limit)
    P = yield from svc.op_partitions()
    offsets = decode_cursor(cursor, lambda v: isinstance(v, list) and len(v) == P
                            and all(is_count(x) for x in v)) or [0] * P
    top = None
    if flt is not None and flt.older_than_s is not None:
        top = flt.max_score((yield from svc.op_now()))
    res = yield from op_dead_pages(offsets, limit, top)
    entries = sorted(((score, rid, p) for p, r in enumerate(res) for rid, score in r),
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


def preview_job(job: Job, from_ms: int, count: Any) -> list[dict[str, str]]:
    """preview of a job's cron in its zone, each time its startAt, endAt or maxRuns would not
    run marked ``skipped`` with the reason (core.lifecycle.skip_reason)."""
    if not job.cron:
        raise ValidationError("jobId", "a one-off job has no schedule to preview")
    times = preview(job.cron, job.tz, from_ms, count)
    kept = 0
    for t, at in zip(times, _preview_ms(job.cron, job.tz, from_ms, len(times)), strict=True):
        reason = skip_reason(at, kept, job.life, job.runs)
        if reason is None:
            kept += 1
        else:
            t["skipped"] = reason
    return times


def _preview_ms(cron: str, tz: str, from_ms: int, count: int) -> list[int]:
    out, at, schedule = [], from_ms, parse_cron(cron, tz)
    for _ in range(count):
        at = schedule.next_after(at)
        out.append(at)
    return out


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
    """What `doctor` and /readyz judge (rdb.redis_facts)."""
    return (yield from op_read_facts())


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def doctor(facts: dict[str, Any], wanted_partitions: int = 0,
           wanted_replicas: int = 0) -> list[Finding]:
    """Judge the facts; every finding that is not ok says what to change.  ``wanted_replicas``:
    the replicas each client-facing write waits for (RSCHED_WAIT_REPLICAS, resolved)."""
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
    lp, want = facts.get("hash-max-listpack-value"), defaults.HASH_LISTPACK_VALUE
    if lp is None:
        out.append(Finding("hash-max-listpack-value", "warn", "cannot read it (CONFIG "
                           f"disabled?): make sure it is {want} or more"))
    elif lp < want:
        out.append(Finding("hash-max-listpack-value", "warn", f"{lp}: a job whose packed spec "
                           f"is longer takes about twice the memory (1,159 B against 545 B for "
                           f"a small payload); set hash-max-listpack-value {want}"))
    else:
        out.append(Finding("hash-max-listpack-value", "ok", str(lp)))
    stored = facts.get("partitions")
    if stored is None:
        out.append(Finding("partitions", "warn", "not set yet: the first rsched process stores "
                           f"{wanted_partitions or defaults.PARTITIONS} (RSCHED_PARTITIONS)"))
    elif wanted_partitions and stored != wanted_partitions:
        out.append(Finding("partitions", "fail", f"Redis holds {stored} partitions, this "
                           f"process wants {wanted_partitions}: set RSCHED_PARTITIONS={stored}"))
    else:
        out.append(Finding("partitions", "ok", str(stored)))
    if (cluster := facts.get("cluster")) is not None:
        out += _cluster_findings(cluster, wanted_partitions, wanted_replicas)
    elif wanted_replicas:
        out.append(_replicas_finding("replicas", facts["replicas"], wanted_replicas))
    return out


def _replicas_finding(check: str, replicas: int, wanted: int) -> Finding:
    """A master's replicas against what writes wait for: fewer is an error (each write would be
    applied, then reported as failed); none at all, with writes not waiting, a warning."""
    if replicas < wanted:
        return Finding(check, "fail", replicas_short(wanted, {"": replicas}) or "")
    if replicas < 1:
        return Finding(check, "warn", "no replica: a failover has nowhere to go; add one")
    return Finding(check, "ok", str(replicas))


def _cluster_findings(cluster: dict[str, Any], wanted_partitions: int,
                      wanted_replicas: int) -> list[Finding]:
    """Cluster state, slot coverage, and per master: the node checks, replicas, min-replicas
    settings and its share of the partitions."""
    out = [Finding("cluster_state", "ok" if cluster["state"] == "ok" else "fail",
                   str(cluster["state"])),
           Finding("slots", "ok" if cluster["covered"] == keys.SLOTS else "fail",
                   f"{cluster['covered']} of {keys.SLOTS} slots served"
                   + ("" if cluster["covered"] == keys.SLOTS else
                      ": assign every slot (redis-cli --cluster fix)"))]
    for m in cluster["masters"]:
        name = m["address"]
        out += [Finding(f"{name} {f.check}", f.level, f.message)
                for f in doctor({**m, "partitions": 0}, 0)[:5]]
        out.append(_replicas_finding(f"{name} replicas", m["replicas"], wanted_replicas))
        if m["min-replicas-to-write"] < 1:
            out.append(Finding(f"{name} min-replicas-to-write", "warn", "0: a master cut off "
                               "from its replica keeps taking writes a failover will drop; "
                               "set min-replicas-to-write 1, min-replicas-max-lag 10"))
        if m["cluster-require-full-coverage"] == "yes":
            out.append(Finding(f"{name} cluster-require-full-coverage", "warn",
                               "yes: while one master is down every master refuses all "
                               "commands; set cluster-require-full-coverage no"))
        level = "warn" if m["partitions"] > m["fair"] + 1 else "ok"
        out.append(Finding(f"{name} partitions", level,
                           f"{m['partitions']} on {m['slots']} slots (its share: {m['fair']})"))
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
