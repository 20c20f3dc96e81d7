"""The read path: run history from the archive plus the events Redis has not handed over yet.

``job_runs`` answers "did it run, when, how often, why did it fail" for one job: attempts newest
first (by scheduled time, then replay round and attempt), one entry per attempt, paginated with
an opaque cursor.  Events are merged by their stream id, so an event both archived and still in
Redis (committed, not yet trimmed) counts once, and one the archiver moves while we read is
found on one side or the other: Redis is read first, the archive second, and an entry leaves
Redis only after the archive committed it.

Aggregates over time ranges (failures, durations) are in stats.py.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, cast

from rsched.archive._paging import check_limit, decode_key, encode_key
from rsched.archive.events import OUTCOMES, RUN_MARKERS, EventRow, decode, expand
from rsched.archive.store import ENV_URL, Store
from rsched.core import defaults
from rsched.core.models import partition_of
from rsched.core.values import read_json
from rsched.rdb import event_streams, keys
from rsched.rdb.redis_api import AsyncRedis, Redis

SCAN_CHUNK = 1000
DEFAULT_MAX_SCAN = 100_000
# What ends an attempt: not a deferral (RateLimited), after which the attempt runs again.
_ENDS = frozenset((*OUTCOMES, "dead_lettered", "skipped")) - {"deferred"}


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


def _coalesce(first: Any, second: Any) -> Any:
    return second if first is None else first


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _result(text: str | None, run_id: str) -> Any:
    """A succeeded attempt's result as the worker wrote it (JSON); one that cannot be read
    back is a placeholder (core.values)."""
    return None if text is None else read_json(text, f"run {run_id} result")


def _attempt(evs: list[EventRow], replays: int, attempt: int, archived: bool) -> RunAttempt:
    """Mirror of the run_attempts view (migrations/0004_run_attempts_started.sql): keep them
    together.  A run that started and finished within one report has no 'started' event: its
    outcome event carries the start (started_ms, fence)."""
    seen = {e.event for e in evs}
    carried = [e for e in evs if e.started_ms is not None]

    def of(kinds: Iterable[str], column: str) -> list[Any]:
        wanted = set(kinds)
        return [getattr(e, column) for e in evs if e.event in wanted]

    status = next((o for o in OUTCOMES if o in seen), None) or (
        "dead" if "dead_lettered" in seen else "skipped" if "skipped" in seen
        else "running" if "started" in seen or carried else "dispatched")
    first = evs[0]
    return RunAttempt(
        job_id=first.job_id or "", run_id=first.run_id or "", replays=replays, attempt=attempt,
        sched_ms=_min(e.sched_ms for e in evs), status=status,
        dead_lettered="dead_lettered" in seen, job_type=_min(e.job_type for e in evs),
        queue=_min(e.queue for e in evs), dispatched_ms=_min(of(["dispatched"], "ts_ms")),
        started_ms=_coalesce(_min(of(["started"], "ts_ms")), _min(e.started_ms for e in carried)),
        ended_ms=_min(of(_ENDS, "ts_ms")),
        duration_ms=_max(e.duration_ms for e in evs),
        worker=_max(of(["started"], "worker")) or _max(of(OUTCOMES, "worker")),
        fence=_coalesce(_max(of(["started"], "fence")), _max(e.fence for e in carried)),
        error=_max(of(["timed_out", "failed"], "error"))
        or _max(of(["abandoned", "cancelled"], "error"))
        or _max(of(["dead_lettered", "skipped"], "error"))
        or (_max(of(["deferred"], "error")) if status == "deferred" else None),
        result=_result(_max(of(["succeeded"], "result")), first.run_id or ""),
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


# --- runs of one job -------------------------------------------------------------------------


Scan = Generator[tuple[str, str, int], Any, tuple[list[EventRow], bool]]


def configured_url(url: str | None = None) -> str | None:
    """The archive the read path merges in: ``url``, else ``RSCHED_ARCHIVE_URL``; None when
    neither is set (readers then keep to Redis's own bounded history, see Client.runs)."""
    return url or os.environ.get(ENV_URL) or None


def check_page(limit: int, cursor: str | None) -> None:
    """ValidationError naming ``limit`` or ``cursor``, before any I/O."""
    check_limit(limit)
    if cursor:
        decode_key(cursor)


def scan_recent(job_id: str, max_scan: int = DEFAULT_MAX_SCAN) -> Scan:
    """Sans-IO scan of the job's partition stream, newest first: yields XREVRANGE requests
    (key, max id, count), receives each reply, returns (the job's run events, partial)."""
    p = partition_of(job_id)
    wanted = job_id.encode()
    out: list[EventRow] = []
    top, scanned = "+", 0
    while True:
        count = min(SCAN_CHUNK, max_scan - scanned)
        if count <= 0:
            return out, bool((yield keys.events(p), top, 1))
        chunk = cast(list[tuple[bytes, dict[bytes, bytes]]], (yield keys.events(p), top, count))
        scanned += len(chunk)
        for sid, entry in chunk:
            if b"n" in entry and wanted not in entry.get(b"r", b""):
                continue  # several runs' events in one entry (events.expand), none of this job
            for esid, f in reversed(expand(sid, entry)):
                r = f.get(b"r")
                # Run events leave the job id to the run id (events.job_of_event_run).
                if r and (f.get(b"j") or r.rpartition(b"@")[0]) == wanted:
                    out.append(decode(p, esid, f))
        if len(chunk) < count:
            return out, False
        top = "(" + chunk[-1][0].decode()


def recent_events(r: Redis, job_id: str, max_scan: int = DEFAULT_MAX_SCAN
                  ) -> tuple[list[EventRow], bool]:
    """The job's run events still in Redis, newest first, at most ``max_scan`` entries read.

    Returns (events, partial): partial when older entries were left unread.
    """
    scan = scan_recent(job_id, max_scan)
    try:
        key, top, count = next(scan)
        while True:
            key, top, count = scan.send(event_streams.recent(r, key, top, count))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arecent_events(r: AsyncRedis, job_id: str, max_scan: int = DEFAULT_MAX_SCAN
                         ) -> tuple[list[EventRow], bool]:
    """recent_events on an asyncio client."""
    scan = scan_recent(job_id, max_scan)
    try:
        key, top, count = next(scan)
        while True:
            key, top, count = scan.send(await event_streams.arecent(r, key, top, count))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def runs_page(store: Store | None, job_id: str, recent: list[EventRow], partial: bool,
              limit: int = defaults.PAGE_LIMIT, cursor: str | None = None) -> RunsPage:
    """One page of the job's attempts from the archive and ``recent`` (see recent_events).

    Read ``recent`` first and call this after: an event leaves Redis only once the archive has
    committed it, so it is then found on one side or the other.  Blocking (store queries): an
    asyncio caller runs it in a thread.
    """
    check_limit(limit)
    before = decode_key(cursor) if cursor else None
    hi = before[0] if before else None
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
    return RunsPage(page, encode_key(page[-1].key) if more else None, partial)


def job_runs(store: Store | None, r: Redis, job_id: str, limit: int = defaults.PAGE_LIMIT,
             cursor: str | None = None, *, max_scan: int = DEFAULT_MAX_SCAN) -> RunsPage:
    """A job's attempts, newest first: archived ones and those only Redis knows yet, once each."""
    check_page(limit, cursor)
    recent, partial = recent_events(r, job_id, max_scan)
    return runs_page(store, job_id, recent, partial, limit, cursor)


__all__ = ["RunAttempt", "RunsPage", "arecent_events", "check_page", "configured_url", "fold",
           "job_runs", "recent_events", "runs_page", "scan_recent"]
