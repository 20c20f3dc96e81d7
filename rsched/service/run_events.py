"""Following runs as they happen, from the partitions' events streams: waiting for a run to end,
and a job's (or many jobs') events one by one, resumable by event id.

Every script appends what it changed to its partition's events stream (the archive reads the
same stream).  An entry may hold a batch of events, each with an id of its own
(rsched.archive.events.expand); an event id is a stream id, so a reader that remembers the last
one it handed out resumes after it exactly, while the stream still holds it (the archiver trims
what it has archived; without one, the dispatcher trims to RSCHED_EVENTS_KEEP(_MS)).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rsched.archive.events import EventRow, decode, expand
from rsched.core.errors import NotFound, RunFailed, ValidationError
from rsched.core.ids import run_id as make_run_id
from rsched.core.models import Job, Run, RunState, job_of_run, partition_of
from rsched.core.wire import parse_sid
from rsched.rdb.event_streams import StreamEntry, op_entries_from, op_follow, op_tops
from rsched.rdb.ops import Op
from rsched.service.jobs import op_get, op_read_run

ENDED = frozenset({RunState.SUCCEEDED, RunState.DEAD, RunState.ABANDONED, RunState.DELETED,
                   RunState.SKIPPED, RunState.CANCELLED})
"""Run states that are final: a wait for the run answers on reaching one."""
ENDING = frozenset({"succeeded", "dead_lettered", "cancelled", "skipped", "abandoned",
                    "dead_deleted"})
"""The events that end a run (into one of the ENDED states): a waiter re-reads its run on
these only."""
MAX_WAIT_S = 60
BLOCK_MS = 2_000  # one XREAD BLOCK at most this long (below any socket timeout a URL sets)
READ_COUNT = 500  # entries per read

def ended(run: Run) -> bool:
    return run.state in ENDED


def check_ended(run: Run | None, run_id: str, timeout: float | None) -> Run:
    """The run a wait read, if it has ended; TimeoutError otherwise."""
    if run is None or not ended(run):
        now = "not dispatched yet" if run is None else run.state.value
        raise TimeoutError(f"run {run_id} has not ended within {timeout} s (it is {now})")
    return run


def first_run(job: Job) -> str:
    """A one-off job's run id (its one occurrence); ValidationError for a recurring job."""
    at = job.run_at_ms or job.next_ms
    if job.cron is not None or (at is None and job.last_run_id is None):
        raise ValidationError("job", f"job {job.id} is recurring: wait for one of its runs "
                                     "by run id instead")
    return job.last_run_id or make_run_id(job.id, at or 0)


def op_is_pending(run_id: str) -> Op[bool]:
    """Whether ``run_id`` is a job's next occurrence, not dispatched yet: its run hash does not
    exist yet, and a wait for it waits for its dispatch too (NotFound: no such job)."""
    job_id, _, at = run_id.rpartition("@")
    job = yield from op_get(job_id)
    return at.isdigit() and int(at) in (job.next_ms, job.run_at_ms)


def result_of(run: Run) -> Any:
    """A succeeded run's result; RunFailed for a run that ended otherwise."""
    if run.state is not RunState.SUCCEEDED:
        raise RunFailed(run.id, run.state.value, run.error)
    return run.result


def check_wait(raw: str | None) -> float:
    """``?wait=S``: seconds, 0 to MAX_WAIT_S."""
    if raw is None:
        return 0.0
    try:
        s = float(raw)
    except ValueError:
        s = -1.0
    if not 0 <= s <= MAX_WAIT_S:
        raise ValidationError("wait", f"must be a number of seconds from 0 to {MAX_WAIT_S}")
    return s


def events_of(p: int, entries: list[StreamEntry]) -> Iterator[tuple[str, EventRow]]:
    """Each event of the entries with its id, oldest first."""
    for sid, fields in entries:
        for eid, ev in expand(sid, fields):
            yield eid.decode(), decode(p, eid, ev)


def with_start(row: EventRow) -> list[EventRow]:
    """The event, an outcome that also carries its run's start (a run started and ended within
    one worker report, lua/complete.lua) preceded by a 'started' event with that start time:
    every state shows, without a Redis write per run for it."""
    if row.started_ms is None or row.event == "started":
        return [row]
    return [row._replace(event="started", ts_ms=row.started_ms, duration_ms=None, error=None,
                         result=None), row]


def check_event_id(raw: str | None) -> tuple[int, int] | None:
    """A Last-Event-ID: a stream id ``<ms>-<seq>`` (None: none given)."""
    if raw is None or raw == "":
        return None
    try:
        ms, seq = parse_sid(raw)
    except ValueError:
        raise ValidationError("Last-Event-ID", "not an event id this API sent") from None
    return ms, seq


@dataclass(slots=True)
class Cursor:
    """Where a follower is: the stream entry read up to (``after``, where the next read starts)
    and the id of the last event of what it read (``last_event``: an entry may hold many
    events, whose ids follow its own); while resuming, the last event id handed out before
    (its entry is read again from its millisecond, the events up to it skipped)."""

    after: str
    resume_after: tuple[int, int] | None = None
    last_event: str = "0-0"


def op_job_events(job_id: str, after: tuple[int, int] | None = None,
                  block_ms: int = BLOCK_MS) -> Iterator[Op[list[tuple[str, EventRow]]]]:
    """The job's events for ever, a read at a time: each item is an Op answering the next
    events (none when ``block_ms`` passed without any), from now or after the event ``after``."""
    p = partition_of(job_id)
    cur: Cursor | None = None

    def read() -> Op[list[tuple[str, EventRow]]]:
        nonlocal cur
        if cur is None:
            cur = yield from op_start(p, after)
        events = yield from op_next_events(p, cur, block_ms)
        return [(eid, row) for eid, row in events if row.job_id == job_id]

    while True:
        yield read()


def op_start(p: int, last_event: tuple[int, int] | None) -> Op[Cursor]:
    """A cursor at the stream's end, or just after the event ``last_event``."""
    if last_event is None:
        top = (yield from op_tops([p]))[p]
        if top is None:
            return Cursor("0-0")
        last = expand(top[0], top[1])[-1][0].decode()
        return Cursor(top[0].decode(), last_event=last)
    return Cursor(f"{last_event[0]}-0", last_event, f"{last_event[0]}-{last_event[1]}")


def op_next_events(p: int, cur: Cursor, block_ms: int) -> Op[list[tuple[str, EventRow]]]:
    """The events after ``cur`` (waiting up to ``block_ms`` for some), moving it on."""
    skip = cur.resume_after
    if skip is not None:
        entries = yield from op_entries_from(p, cur.after, READ_COUNT)  # inclusive
        cur.resume_after = None
    else:
        entries = yield from op_follow(p, cur.after, block_ms, READ_COUNT)
    if entries:
        cur.after = entries[-1][0].decode()
    events = list(events_of(p, entries))
    if events:
        cur.last_event = events[-1][0]
    if skip is not None:
        events = [(eid, row) for eid, row in events if parse_sid(eid) > skip]
    return events


def op_wait_run(run_id: str, timeout_s: float,
                clock: Callable[[], float] = time.monotonic) -> Op[Run | None]:
    """The run once it has ended, or as it is after ``timeout_s`` (math.inf: no limit): one
    blocking stream read at a time, the run re-read only when one of its events comes.  A run
    its job has not dispatched yet (its next occurrence) is waited for too: None if it still
    does not exist at the end.  NotFound for any other run that does not exist."""
    p = partition_of(job_of_run(run_id))
    cur = yield from op_start(p, None)  # before the state: no event can fall in between
    run = yield from op_read_run(run_id)
    if run is None and not (yield from op_is_pending(run_id)):
        raise NotFound("run", run_id)
    deadline = clock() + timeout_s
    while run is None or not ended(run):
        left = deadline - clock()
        if left <= 0:
            break
        block = BLOCK_MS if left > BLOCK_MS / 1000 else max(1, int(left * 1000))
        events = yield from op_next_events(p, cur, block)
        if any(row.run_id == run_id and row.event in ENDING for _, row in events):
            run = yield from op_read_run(run_id)
    return run


__all__ = ["ENDED", "ENDING", "MAX_WAIT_S", "Cursor", "check_ended", "check_event_id",
           "check_wait", "ended", "events_of", "first_run", "op_is_pending", "op_job_events",
           "op_next_events", "op_start", "op_wait_run", "result_of", "with_start"]
