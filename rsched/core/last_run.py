"""A job's latest run and failure streak, folded from what Redis holds (pure): the jobs list
shows it (rsched.service.last_runs reads it for a page) and the archive's job index stores its
status and time (rsched.archive.job_index), so both judge a job's latest run the same way.

The streak counts finished runs whose last attempt failed (failed, timed out, dead-lettered,
waiting for a retry, or deleted from the dead letters) back to the latest success; runs in
flight and abandoned ones are skipped.  It is exact up to the history records read, and
``streak_capped`` says when the streak reached the end of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsched.core.errors import ValidationError
from rsched.core.wire import as_text

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
        return self.status in filter_statuses(wanted)


def filter_statuses(wanted: str) -> tuple[str, ...]:
    """The latest-run statuses a ``lastRun`` filter takes."""
    return ("failed", "dead") if wanted == "failed" else (wanted,)


def check_filter(value: str | None) -> str | None:
    if value is not None and value not in LAST_RUN_FILTERS:
        raise ValidationError("lastRun", "must be one of " + ", ".join(LAST_RUN_FILTERS))
    return value


def fold(rid: str | None, own: list[Any], plain: list[Any] | None,
         hist: list[dict[str, Any]], scanned: int) -> LastRun:
    """A job's latest run ``rid`` (its last_run_id) from its own run's fields (id, state,
    ended_ms, started_ms), its latest plain run's hash (state, ended_ms, started_ms; None when
    the own run is the latest) and its newest history records (decoded, newest first;
    ``scanned`` of them were asked for)."""
    # Each run's newest state: (ended ms, status); history records are newest first.
    runs: dict[str, tuple[int, str]] = {}
    for rec in hist:
        runs.setdefault(rec["run"], (int(rec.get("ended_ms") or 0), rec["status"]))
    own_id, own_state = _s(own[0]), _s(own[1])
    if own_id and own_state:
        runs[own_id] = (_i(own[2]) or _i(own[3]) or 0, own_state)
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
        capped = len(hist) >= scanned
    return LastRun(rid if status else None, status, at, streak, capped)


def plain_run(rid: str | None, own_run_id: Any) -> str | None:
    """A job's latest run ``rid`` when its hash is a run hash of its own (not the own run's
    fields in the job hash): the run whose state must be read as well."""
    return rid if rid and rid != _s(own_run_id) else None


__all__ = ["LAST_RUN_FILTERS", "LastRun", "check_filter", "filter_statuses", "fold", "plain_run"]
