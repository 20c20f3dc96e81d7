"""The read path: run history from the archive plus the events Redis has not handed over yet.

``job_runs`` answers "did it run, when, how often, why did it fail" for one job: attempts newest
first (by scheduled time, then replay round and attempt), one entry per attempt, paginated with
an opaque cursor.  Events are merged by their stream id, so an event both archived and still in
Redis (committed, not yet trimmed) counts once, and one the archiver moves while we read is
found on one side or the other: Redis is read first, the archive second, and an entry leaves
Redis only after the archive committed it.

``failures`` and ``duration_stats`` read the archive alone (aggregates over time ranges).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis import Redis

from .. import keys
from ..errors import ValidationError
from ..models import partition_of
from .events import OUTCOMES, RUN_MARKERS, EventRow, decode
from .store import Store

MAX_LIMIT = 1000
SCAN_CHUNK = 1000
DEFAULT_MAX_SCAN = 100_000
_ENDS = frozenset((*OUTCOMES, "dead_lettered", "skipped"))


@dataclass(frozen=True, slots=True)
class RunAttempt:
    """One attempt of one run (a skipped occurrence is attempt 0), folded from its events."""

    job_id: str
    run_id: str
    replays: int  # dead-letter replays of the run before this attempt (attempts restart at 1)
    attempt: int
    sched_ms: int
    status: str  # succeeded|failed|timed_out|abandoned|dead|skipped|running|dispatched
    dead_lettered: bool
    job_type: str | None
    queue: str | None
    dispatched_ms: int | None
    started_ms: int | None
    ended_ms: int | None
    duration_ms: int | None
    worker: str | None
    fence: int | None
    error: str | None
    result: Any
    retry_at_ms: int | None
    archived: bool  # every event of the attempt came from the archive

    @property
    def key(self) -> tuple[int, int, int]:
        """Sort key, newest last: scheduled time, replay round, attempt."""
        return (self.sched_ms, self.replays, self.attempt)


@dataclass(frozen=True, slots=True)
class RunsPage:
    items: list[RunAttempt]
    next_cursor: str | None
    partial: bool = False
    """True when Redis held more unarchived events than max_scan: older ones may be missing."""


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _result(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _attempt(evs: list[EventRow], replays: int, attempt: int, archived: bool) -> RunAttempt:
    """Mirror of the run_attempts view (migrations/0002_run_attempts.sql): keep them together."""
    seen = {e.event for e in evs}

    def of(kinds: Iterable[str], column: str) -> list[Any]:
        wanted = set(kinds)
        return [getattr(e, column) for e in evs if e.event in wanted]

    status = next((o for o in OUTCOMES if o in seen), None) or (
        "dead" if "dead_lettered" in seen else "skipped" if "skipped" in seen
        else "running" if "started" in seen else "dispatched")
    first = evs[0]
    return RunAttempt(
        job_id=first.job_id or "", run_id=first.run_id or "", replays=replays, attempt=attempt,
        sched_ms=_min(e.sched_ms for e in evs), status=status,
        dead_lettered="dead_lettered" in seen, job_type=_min(e.job_type for e in evs),
        queue=_min(e.queue for e in evs), dispatched_ms=_min(of(["dispatched"], "ts_ms")),
        started_ms=_min(of(["started"], "ts_ms")), ended_ms=_min(of(_ENDS, "ts_ms")),
        duration_ms=_max(e.duration_ms for e in evs),
        worker=_max(of(["started"], "worker")) or _max(of(OUTCOMES, "worker")),
        fence=_max(of(["started"], "fence")),
        error=_max(of(["timed_out", "failed"], "error")) or _max(of(["abandoned"], "error"))
        or _max(of(["dead_lettered", "skipped"], "error")),
        result=_result(_max(of(["succeeded"], "result"))),
        retry_at_ms=_max(e.retry_at_ms for e in evs), archived=archived,
    )


def fold(events: Iterable[EventRow], archived: set[tuple[int, int, int]] | None = None
         ) -> list[RunAttempt]:
    """Group run events into attempts: (run, replays so far, attempt number), in stream order.

    ``archived``: (sid_ms, sid_seq, part) of the events read from the archive.
    """
    by_run: dict[str, list[EventRow]] = defaultdict(list)
    for e in events:
        if e.run_id is not None and e.sched_ms is not None:
            by_run[e.run_id].append(e)
    out: list[RunAttempt] = []
    for evs in by_run.values():
        evs.sort(key=lambda e: (e.sid_ms, e.sid_seq))
        replays = 0
        groups: dict[tuple[int, int], list[EventRow]] = {}
        for e in evs:
            if e.event == "replayed":
                replays += 1
            if e.event not in RUN_MARKERS:
                groups.setdefault((replays, e.attempt or 0), []).append(e)
        for (rounds, attempt), g in groups.items():
            done = all((e.sid_ms, e.sid_seq, e.part) in (archived or ()) for e in g)
            out.append(_attempt(g, rounds, attempt, archived is not None and done))
    return out


# --- cursors ---------------------------------------------------------------------------------


def _encode(key: Sequence[int]) -> str:
    return ".".join(str(k) for k in key)


def _decode(cursor: str) -> tuple[int, int, int]:
    parts = cursor.split(".")
    if len(parts) != 3 or not all(p.lstrip("-").isdigit() for p in parts):
        raise ValidationError("cursor", "not a cursor returned by a previous page")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be an integer between 1 and {MAX_LIMIT}")


# --- runs of one job -------------------------------------------------------------------------


def recent_events(r: Redis, job_id: str, max_scan: int = DEFAULT_MAX_SCAN
                  ) -> tuple[list[EventRow], bool]:
    """The job's run events still in its partition's stream, newest first; bounded by max_scan.

    Returns (events, partial): partial when older entries were left unread.
    """
    p = partition_of(job_id)
    wanted = job_id.encode()
    out: list[EventRow] = []
    top, scanned = "+", 0
    while True:
        count = min(SCAN_CHUNK, max_scan - scanned)
        if count <= 0:
            return out, bool(r.xrevrange(keys.events(p), max=top, min="-", count=1))
        raw: Any = r.xrevrange(keys.events(p), max=top, min="-", count=count)
        chunk = cast(list[tuple[bytes, dict[bytes, bytes]]], raw)
        scanned += len(chunk)
        for sid, f in chunk:
            if f.get(b"j") == wanted and f.get(b"r"):
                out.append(decode(p, sid, f))
        if len(chunk) < count:
            return out, False
        top = "(" + chunk[-1][0].decode()


def job_runs(store: Store | None, r: Redis, job_id: str, limit: int = 50,
             cursor: str | None = None, *, max_scan: int = DEFAULT_MAX_SCAN) -> RunsPage:
    """A job's attempts, newest first: archived ones and those only Redis knows yet, once each."""
    _check_limit(limit)
    before = _decode(cursor) if cursor else None
    hi = before[0] if before else None
    recent, partial = recent_events(r, job_id, max_scan)  # Redis before the archive: see above
    recent = [e for e in recent if e.sched_ms is not None and (hi is None or e.sched_ms <= hi)]
    want = limit + 2
    while True:
        scheds = {e.sched_ms for e in recent if e.sched_ms is not None}
        if store is not None:
            scheds.update(store.job_scheds(job_id, hi, want))
        window = sorted(scheds, reverse=True)[:want]
        if not window:
            return RunsPage([], None, partial)
        lo = window[-1]
        merged: dict[tuple[int, int], EventRow] = {}
        if store is not None:
            merged = {(e.sid_ms, e.sid_seq): e for e in store.job_events(job_id, lo, hi)}
        archived = {(e.sid_ms, e.sid_seq, e.part) for e in merged.values()}
        for e in recent:
            if e.sched_ms is not None and e.sched_ms >= lo:
                merged.setdefault((e.sid_ms, e.sid_seq), e)
        attempts = [a for a in fold(merged.values(), archived) if before is None or a.key < before]
        # A run of markers only (triggered, not yet dispatched) has no attempt: widen the window.
        if len(attempts) > limit or len(window) < want:
            break
        want *= 4
    attempts.sort(key=lambda a: a.key, reverse=True)
    page = attempts[:limit]
    more = len(attempts) > limit
    return RunsPage(page, _encode(page[-1].key) if more else None, partial)


# --- aggregates over the archive -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    job_id: str | None
    run_id: str | None
    attempt: int | None
    status: str  # failed | timed_out | abandoned
    ts_ms: int | None
    sched_ms: int | None
    job_type: str | None
    queue: str | None
    worker: str | None
    duration_ms: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class FailuresPage:
    items: list[Failure]
    next_cursor: str | None


def _range(since_ms: int | None, until_ms: int | None) -> tuple[int, int]:
    lo = 0 if since_ms is None else since_ms
    hi = 2**62 if until_ms is None else until_ms
    if lo >= hi:
        raise ValidationError("since", "must be before until")
    return lo, hi


def failures(store: Store, job_type: str | None = None, since_ms: int | None = None,
             until_ms: int | None = None, limit: int = 100, cursor: str | None = None
             ) -> FailuresPage:
    """Failed, timed-out and abandoned attempts (of a type) with since <= time < until."""
    _check_limit(limit)
    lo, hi = _range(since_ms, until_ms)
    before = _decode(cursor) if cursor else None
    rows = store.failures(job_type, lo, hi, before, limit + 1)
    items = [Failure(e.job_id, e.run_id, e.attempt, e.event, e.ts_ms, e.sched_ms, e.job_type,
                     e.queue, e.worker, e.duration_ms, e.error) for e in rows[:limit]]
    last = rows[limit - 1] if len(rows) > limit else None
    return FailuresPage(items, _encode((last.ts_ms or 0, last.sid_ms, last.sid_seq))
                        if last else None)


@dataclass(frozen=True, slots=True)
class DurationStats:
    count: int  # finished attempts with a duration
    failed: int  # of which failed or timed out
    mean_ms: float
    max_ms: int
    quantiles: dict[str, int]  # "p50", "p90", ...: nearest-rank duration in ms


QUANTILES = (0.5, 0.9, 0.95, 0.99)


def duration_stats(store: Store, since_ms: int | None = None, until_ms: int | None = None,
                   job_type: str | None = None, quantiles: Sequence[float] = QUANTILES
                   ) -> dict[str, DurationStats]:
    """Per job type: how long finished attempts took (nearest-rank percentiles)."""
    lo, hi = _range(since_ms, until_ms)
    if not quantiles or not all(0 < q <= 1 for q in quantiles):
        raise ValidationError("quantiles", "each must be in (0, 1]")
    names = [f"p{q * 100:g}" for q in quantiles]
    out: dict[str, DurationStats] = {}
    for row in store.durations(lo, hi, job_type, quantiles):
        jtype, count, failed, mean, top, *qs = row
        out[jtype] = DurationStats(int(count), int(failed), float(mean), int(top),
                                   {n: int(v) for n, v in zip(names, qs, strict=True)})
    return out


__all__ = ["DurationStats", "Failure", "FailuresPage", "QUANTILES", "RunAttempt", "RunsPage",
           "duration_stats", "failures", "fold", "job_runs", "recent_events"]
