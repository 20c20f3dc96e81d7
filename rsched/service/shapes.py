"""camelCase JSON out: what the HTTP API answers and the CLI prints with ``--json``, from the
service's values.  Here, in a layer neither face owns, so the CLI needs nothing of rsched.api.

Times go out as ISO-8601 in UTC with ``Z``; durations in seconds, except ``*Ms`` fields.
"""

from __future__ import annotations

import json
from typing import Any

from rsched.archive.events import EventRow
from rsched.archive.history import RunsPage
from rsched.archive.stats import DurationStats, FailuresPage
from rsched.core import wire
from rsched.core.catchup import Gap
from rsched.core.lifecycle import NO_LIFE
from rsched.core.limits import Limit, body_of
from rsched.core.models import Attempt, Job, JobStatus, Misfire, Overlap, Run
from rsched.core.times import ms_to_iso, ms_to_iso_fast
from rsched.core.values import jsonable, read_json
from rsched.core.views import DispatcherStatus, PartitionStatus, Status, WorkerStatus
from rsched.rdb.limit_scripts import BusyKey
from rsched.service.apikeys import ApiKey
from rsched.service.backfill import Backfill
from rsched.service.doctor import Finding
from rsched.service.job_listing import Listing
from rsched.service.last_runs import LastRun
from rsched.service.limits import LimitView
from rsched.service.listings import DeadLetter, Page
from rsched.service.memory import MemoryPart
from rsched.service.operations import Operation

iso = ms_to_iso_fast  # a batch's jobs share their creation and run times: cached


def seconds(ms: int) -> int | float:
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


class _Memo(dict[Any, Any]):
    """``memo[x]`` is ``fn(x)``, kept for the next job (a dict lookup costs a tenth of a
    function call, and a batch's jobs share their settings); cleared when it grows large."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: Any) -> Any:
        if len(self) >= 4096:
            self.clear()
        value = self[key] = self.fn(key)
        return value


_SECONDS = _Memo(seconds)
_ISO = _Memo(iso)
# Each member's text, read without Enum.value's descriptor: a batch reads two per job.
_TEXT: dict[Any, str] = {m: m.value for e in (JobStatus, Misfire, Overlap)
                         for m in e}


def job_json(job: Job) -> dict[str, Any]:
    secs, times = _SECONDS, _ISO
    return {
        "id": job.id, "type": job.type, "queue": job.queue, "status": _TEXT[job.status],
        "payload": job.payload, "runAt": times[job.run_at_ms], "cron": job.cron,
        "timeZone": job.tz,
        "nextRunAt": times[job.next_ms] if job.status is JobStatus.SCHEDULED else None,
        "maxAttempts": job.max_attempts,
        "backoff": {"baseSeconds": secs[job.backoff_base_ms],
                    "capSeconds": secs[job.backoff_cap_ms]},
        "priority": job.priority, "timeoutSeconds": secs[job.timeout_ms],
        "idempotencyKey": job.idempotency_key, "misfire": _TEXT[job.misfire],
        "jitterSeconds": secs[job.jitter_ms], "lastRunId": job.last_run_id,
        "createdAt": times[job.created_ms], "updatedAt": times[job.updated_ms],
        "catchUpWindowSeconds": secs[job.catch_up_window_ms], "overlap": _TEXT[job.overlap],
        "version": job.version, "limitKey": job.limit_key, "target": job.target,
        "lastGap": gap_json(job.last_gap) if job.last_gap else None,
        **(life_json(job) if job.life is not NO_LIFE or job.fail_streak or job.paused
           or job.resumed else _NO_LIFE_JSON),
    }


def created_json(job: Job) -> dict[str, Any]:
    """A create's answer: the job, and whether a dedup window answered with it."""
    out = job_json(job)
    out["deduplicated"] = job.deduplicated
    return out


def life_json(job: Job) -> dict[str, Any]:
    """The lifecycle fields (core.lifecycle) and who paused or resumed the job, when, why."""
    life, p, r = job.life, job.paused, job.resumed
    return {
        "startAt": iso(life.start_at_ms or None), "endAt": iso(life.end_at_ms or None),
        "maxRuns": life.max_runs or None, "remainingRuns": job.remaining_runs,
        "pauseAfterFailures": life.pause_after or None,
        "deadLetterStreak": job.fail_streak,
        "startDeadlineSeconds": seconds(life.start_deadline_ms) if life.start_deadline_ms
        else None,
        "pausedAt": iso(p.at_ms) if p else None, "pausedBy": p.by if p else None,
        "pauseNote": p.note if p else None, "pausedReason": p.reason if p else None,
        "resumedAt": iso(r.at_ms) if r else None, "resumedBy": r.by if r else None,
        "resumeNote": r.note if r else None,
    }


LIFE_KEYS = ("startAt", "endAt", "maxRuns", "remainingRuns", "pauseAfterFailures",
             "deadLetterStreak", "startDeadlineSeconds", "pausedAt", "pausedBy", "pauseNote",
             "pausedReason", "resumedAt", "resumedBy", "resumeNote")
# A job without limits or pauses (most of a batch): the same fields, built once.
_NO_LIFE_JSON: dict[str, Any] = dict.fromkeys(LIFE_KEYS, None) | {"deadLetterStreak": 0}


def gap_json(gap: Gap) -> dict[str, Any]:
    """Occurrences missed by more than the catch-up window and skipped together."""
    return {"count": gap.size, "exact": gap.exact, "from": iso(gap.first_ms),
            "to": iso(gap.last_ms)}


def attempt_json(a: Attempt) -> dict[str, Any]:
    return {
        "runId": a.run_id, "attempt": a.attempt, "status": a.status, "worker": a.worker,
        "scheduledAt": iso(a.sched_ms), "startedAt": iso(a.started_ms),
        "endedAt": iso(a.ended_ms), "durationMs": a.duration_ms, "error": a.error,
        "result": a.result, "deadLettered": a.dead_lettered,
    }


def history_json(page: RunsPage) -> dict[str, Any]:
    """GET /jobs/{id}/runs from the archive: attempt_json's fields and what the events add."""
    return {"runs": [dict(
        attempt_json(a),  # type: ignore[arg-type]  # RunAttempt has every field of Attempt
        jobId=a.job_id, type=a.job_type, queue=a.queue, replays=a.replays,
        deadLettered=a.dead_lettered, dispatchedAt=iso(a.dispatched_ms),
        retryAt=iso(a.retry_at_ms), archived=a.archived) for a in page.items],
        "nextCursor": page.next_cursor, "partial": page.partial}


def failures_json(page: FailuresPage) -> dict[str, Any]:
    return {"failures": [
        {"jobId": f.job_id, "runId": f.run_id, "attempt": f.attempt, "status": f.status,
         "at": iso(f.ts_ms), "scheduledAt": iso(f.sched_ms), "type": f.job_type,
         "queue": f.queue, "worker": f.worker, "durationMs": f.duration_ms, "error": f.error}
        for f in page.items], "nextCursor": page.next_cursor}


def durations_json(stats: dict[str, DurationStats]) -> list[dict[str, Any]]:
    return [{"type": t, "count": d.count, "failed": d.failed, "meanMs": d.mean_ms,
             "maxMs": d.max_ms, "percentiles": d.quantiles} for t, d in stats.items()]


def run_json(r: Run) -> dict[str, Any]:
    return {
        "runId": r.id, "jobId": r.job_id, "type": r.type, "queue": r.queue,
        "status": r.state.value, "attempt": r.attempt, "worker": r.worker,
        "scheduledAt": iso(r.sched_ms), "dispatchedAt": iso(r.dispatched_ms),
        "startedAt": iso(r.started_ms), "endedAt": iso(r.ended_ms),
        "durationMs": r.duration_ms, "error": r.error, "result": r.result,
        "jobVersion": r.job_version, "waitingFor": r.waiting_for,
        "progress": _progress_json(r.progress),
    }


def _progress_json(p: Any) -> dict[str, Any] | None:
    """A run's last progress as the API shows it: value, message and the time (ISO)."""
    if not isinstance(p, dict) or "value" not in p:
        return None
    at = p.get("at")
    return {"value": p["value"], "message": p.get("message"),
            "at": iso(at) if isinstance(at, int) else None}


def event_json(event_id: str | None, row: EventRow) -> dict[str, Any]:
    """One event of the SSE streams (GET /jobs/{id}/events, /events): what the events stream
    holds of it, the fields it does not carry left out."""
    out: dict[str, Any] = {"id": event_id, "event": row.event, "jobId": row.job_id,
                           "at": iso(row.ts_ms)}
    for name, value in (("runId", row.run_id), ("attempt", row.attempt),
                        ("worker", row.worker), ("durationMs", row.duration_ms),
                        ("type", row.job_type), ("queue", row.queue), ("error", row.error)):
        if value is not None:
            out[name] = value
    if row.sched_ms is not None and row.run_id is not None:
        out["scheduledAt"] = iso(row.sched_ms)
    if row.retry_at_ms is not None:
        out["retryAt"] = iso(row.retry_at_ms)
    if row.result is not None:
        out["result"] = jsonable(read_json(row.result, f"run {row.run_id} result"))
    if row.event == "progress" and row.extra:  # 'pg' has no archive column: in extra
        pg = json.loads(row.extra).get(wire.EV_PROGRESS.decode())
        out["progress"] = _progress_json(read_json(pg, f"run {row.run_id} progress")
                                         if pg else None)
    return out


def backfill_json(b: Backfill) -> dict[str, Any]:
    """A backfill's answer: the range's times, what became of each (a dry run: what would
    become of each now) and how many of each."""
    out: dict[str, Any] = {"jobId": b.job_id, "from": ms_to_iso(b.from_ms),
                           "to": ms_to_iso(b.to_ms), "dryRun": b.dry_run,
                           "overlap": b.overlap.value, "count": len(b.times),
                           "times": [ms_to_iso_fast(t) for t in b.times]}
    groups = (("queued", b.queued), ("alreadyRun", b.existing), ("skipped", b.skipped),
              ("buffered", b.buffered))
    out["counts"] = {name: len(ts) for name, ts in groups}
    for name, ts in groups:
        out[name] = [ms_to_iso_fast(t) for t in ts]
    return out


def dead_letter_json(d: DeadLetter) -> dict[str, Any]:
    return dict(run_json(d.run), deadAt=iso(d.dead_ms))


def limit_json(limit: Limit) -> dict[str, Any]:
    return body_of(limit)


def limit_view_json(view: LimitView) -> dict[str, Any]:
    """A definition; a key's own with its inFlight and waiting counts; its busiest keys."""
    out = body_of(view.limit)
    if view.in_flight is not None:
        out["inFlight"], out["waiting"] = view.in_flight, view.waiting
    out["busiestKeys"] = [busy_key_json(k) for k in view.busiest]
    return out


def queue_limit_json(view: LimitView) -> dict[str, Any]:
    """A queue's limit; with its counts: permits held (runs of the queue running, and
    reservations for woken runs) and runs waiting."""
    out = body_of(view.limit)
    out = {"queue": out.pop("name"), **out}
    if view.in_flight is not None:
        out["inFlight"], out["waiting"] = view.in_flight, view.waiting
    return out


def busy_key_json(k: BusyKey) -> dict[str, Any]:
    """One limit key's counts now: runs holding a slot, waiting, starts in its rate window."""
    return {"key": k.key, "inFlight": k.in_flight, "waiting": k.waiting,
            "recentStarts": k.recent_starts}


def operation_json(op: Operation) -> dict[str, Any]:
    return {"id": op.id, "kind": op.kind, "status": op.status, "dryRun": op.dry_run,
            "filter": op.filter, "createdAt": iso(op.created_ms),
            "updatedAt": None if op.updated_ms is None else iso(op.updated_ms),
            "endedAt": None if op.ended_ms is None else iso(op.ended_ms), "total": op.total,
            "scanned": op.scanned, "matched": op.matched, "deleted": op.deleted, "who": op.who,
            "error": op.error, "cancelledBy": op.cancelled_by}


def key_json(k: ApiKey) -> dict[str, Any]:
    return {"id": k.id, "name": k.name, "scope": k.scope, "createdAt": iso(k.created_ms)}


def runs_json(page: Page | RunsPage) -> dict[str, Any]:
    """GET /jobs/{id}/runs from either history source (rsched.service.history): the two share
    attempt_json's fields; the archive's adds what the events tell and ``partial``."""
    if isinstance(page, RunsPage):
        return history_json(page)
    return {"runs": [attempt_json(a) for a in page.items], "nextCursor": page.next_cursor}


def finding_json(f: Finding) -> dict[str, Any]:
    return {"check": f.check, "level": f.level, "message": f.message}


# --- GET /status ---------------------------------------------------------------------------------


def _partition_json(p: PartitionStatus) -> dict[str, Any]:
    return {
        "partition": p.partition, "owner": p.owner,
        "leaseExpiresAt": ms_to_iso(p.lease_expires_ms), "fence": p.fence,
        "dueBacklog": p.due_backlog, "retryBacklog": p.retry_backlog,
        "oldestDueAgeMs": p.oldest_due_age_ms, "deadLetters": p.dead_letters,
    }


def _dispatcher_json(d: DispatcherStatus) -> dict[str, Any]:
    return {"id": d.id, "expiresAt": ms_to_iso(d.expires_ms), "partitions": list(d.partitions)}


def _worker_json(w: WorkerStatus) -> dict[str, Any]:
    return {
        "id": w.id, "queues": list(w.queues), "inflight": w.inflight,
        "concurrency": w.concurrency, "host": w.host, "pid": w.pid,
        "lastHeartbeatAt": ms_to_iso(w.last_heartbeat_ms), "alive": w.alive,
        "deadSince": ms_to_iso(w.dead_since_ms),
    }


def memory_json(parts: list[MemoryPart]) -> dict[str, Any]:
    """GET /memory: the projection's parts, the total last."""
    return {"parts": [{"part": p.part, "bytes": p.bytes, "how": p.how} for p in parts]}


def status_json(s: Status) -> dict[str, Any]:
    return {
        "now": ms_to_iso(s.now_ms),
        "partitions": [_partition_json(p) for p in s.partitions],
        "dispatchers": [_dispatcher_json(d) for d in s.dispatchers],
        "workers": [_worker_json(w) for w in s.workers],
        "queues": [{"queue": q.queue, "length": q.length, "pending": q.pending,
                    "liveWorkers": q.live_workers, "unserved": q.unserved} for q in s.queues],
        "waitingForHandler": [{"queue": w.queue, "type": w.type, "runs": w.runs,
                               "served": w.served} for w in s.waiting],
        "dueBacklog": s.due_backlog,
        "deadLetters": s.dead_letters,
    }


def listing_json(page: Listing) -> dict[str, Any]:
    """GET /jobs: a page of jobs, each with its latest run, and how the page was read."""
    return {"jobs": [dict(job_json(j), lastRun=last_run_json(lr))
                     for j, lr in zip(page.jobs, page.last_runs, strict=True)],
            "nextCursor": page.next_cursor, "indexed": page.indexed, "sort": page.sort,
            "indexedUntil": iso(page.indexed_until_ms)}


def last_run_json(lr: LastRun) -> dict[str, Any]:
    """GET /jobs's ``lastRun`` of each job (rsched.service.last_runs)."""
    return {"runId": lr.run_id, "status": lr.status, "at": iso(lr.at_ms),
            "failureStreak": lr.failure_streak, "streakCapped": lr.streak_capped}
