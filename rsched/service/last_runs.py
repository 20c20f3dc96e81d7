"""What the jobs list shows of each job's runs: the latest run's status and time, and the current
failure streak, read for a page of jobs in two round trips, off the hot path.

Nothing on the write path keeps a streak: it is counted here from what Redis already holds, the
latest run (its hash, or for a one-off job's own run the job hash) and the job's bounded history
list, newest first.  The streak counts finished runs whose last attempt failed (failed, timed
out, dead-lettered, waiting for a retry, or deleted from the dead letters) back to the latest
success; runs in flight and abandoned ones are skipped.  It is exact up to STREAK_SCAN attempt
records (the history list holds at most RSCHED_HISTORY_LEN), and ``streak_capped`` says when
the streak reached the end of what was read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rsched.core.errors import ValidationError
from rsched.core.models import Job
from rsched.core.wire import as_text
from rsched.rdb.job_reads import op_latest_runs, op_run_states
from rsched.rdb.ops import Op

STREAK_SCAN = 50  # attempt records read per job
LAST_RUN_FILTERS = ("failed", "dead", "succeeded")
_FAILED = frozenset({"failed", "timed_out", "dead", "retry_wait", "deleted"})
_SKIPPED = frozenset({"running", "dispatched", "abandoned"})
_STATUS = {"retry_wait": "failed"}  # a run waiting for its retry: its last attempt failed


def _s(v: Any) -> str | None:
    return None if v is None else as_text(v)


def _i(v: Any) -> int | None:
    s = _s(v)
    return int(s) if s and s.lstrip("-").isdigit() else None


@dataclass(frozen=True, slots=True)
class LastRun:
    run_id: str | None
    status: str | None  # succeeded | failed | dead | running | dispatched | abandoned | deleted
    at_ms: int | None  # when it ended, else started, else was scheduled
    failure_streak: int
    streak_capped: bool  # the streak may be longer than what the history list held

    def matches(self, wanted: str) -> bool:
        """GET /jobs?lastRun=: failed takes dead too (every run whose last attempt failed)."""
        if wanted == "failed":
            return self.status in ("failed", "dead")
        return self.status == wanted


def check_filter(value: str | None) -> str | None:
    if value is not None and value not in LAST_RUN_FILTERS:
        raise ValidationError("lastRun", "must be one of " + ", ".join(LAST_RUN_FILTERS))
    return value


def op_last_runs(jobs: Sequence[Job]) -> Op[list[LastRun]]:
    """The latest run and failure streak of each job, in the jobs' order."""
    got = yield from op_latest_runs([(j.partition, j.id) for j in jobs], STREAK_SCAN)
    own = [fields for fields, _ in got]
    hist = [[json.loads(raw) for raw in raws] for _, raws in got]
    plain = [i for i, j in enumerate(jobs) if j.last_run_id and j.last_run_id != _s(own[i][0])]
    runs = yield from op_run_states([(jobs[i].partition, jobs[i].last_run_id or "")
                                     for i in plain])
    latest = dict(zip(plain, runs, strict=True))
    return [_fold(j, own[i], latest.get(i), hist[i]) for i, j in enumerate(jobs)]


def _fold(job: Job, own: list[Any], plain: list[Any] | None, hist: list[dict[str, Any]]
          ) -> LastRun:
    # Each run's newest state: (ended ms, status); history records are newest first.
    runs: dict[str, tuple[int, str]] = {}
    for rec in hist:
        runs.setdefault(rec["run"], (int(rec.get("ended_ms") or 0), rec["status"]))
    own_id, own_state = _s(own[0]), _s(own[1])
    if own_id and own_state:
        runs[own_id] = (_i(own[2]) or _i(own[3]) or 0, own_state)
    rid = job.last_run_id
    status, at = None, None
    if rid:
        fields = own[1:] if rid == own_id else plain or [None, None, None]
        state = _s(fields[0])
        if state is None and rid in runs:  # its hash expired: its newest record tells
            state = runs[rid][1]
        if state is not None:
            status = _STATUS.get(state, state)
            at = _i(fields[1]) or _i(fields[2]) or (runs[rid][0] if rid in runs else None)
            at = at or _i(rid.rsplit("@", 1)[-1])  # the scheduled time, in the run id
            runs[rid] = (at or 0, state)
    streak, capped = 0, False
    for _, state in sorted(runs.values(), key=lambda v: v[0], reverse=True):
        if state in _SKIPPED:
            continue
        if state not in _FAILED:
            break
        streak += 1
    else:
        capped = len(hist) >= STREAK_SCAN
    return LastRun(rid if status else None, status, at, streak, capped)


__all__ = ["LAST_RUN_FILTERS", "STREAK_SCAN", "LastRun", "check_filter", "op_last_runs"]
