"""Questions over time ranges, from the archive: failures of a type, durations per type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rsched.archive._paging import check_limit, decode_key, encode_key
from rsched.archive.store import Store
from rsched.core.errors import ValidationError


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
    check_limit(limit)
    lo, hi = _range(since_ms, until_ms)
    before = decode_key(cursor) if cursor else None
    rows = store.failures(job_type, lo, hi, before, limit + 1)
    items = [Failure(e.job_id, e.run_id, e.attempt, e.event, e.ts_ms, e.sched_ms, e.job_type,
                     e.queue, e.worker, e.duration_ms, e.error) for e in rows[:limit]]
    last = rows[limit - 1] if len(rows) > limit else None
    return FailuresPage(items, encode_key((last.ts_ms or 0, last.sid_ms, last.sid_seq))
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


__all__ = ["DurationStats", "Failure", "FailuresPage", "QUANTILES", "duration_stats", "failures"]
