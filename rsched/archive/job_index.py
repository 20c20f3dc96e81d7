"""The archive's job index: one row per job in the ``jobs`` table (migrations/0005_jobs), kept
by the archiver off the hot path and read by filtered job listings (rsched.service.job_listing).

Events do not carry every field a listing filters or sorts on ('scheduled' has no next run,
'succeeded' no job status), so the archiver reads the current state of the jobs a batch names
from Redis (two pipelined round trips for the whole batch) and writes their rows in the batch's
own transaction.  Each row keeps the id of the latest event of its job that was applied, and a
row is only replaced by a batch holding a later event of the job: a batch delivered twice (an
archiver killed between commit and XACK, a claimed batch) changes nothing.  Every change of a
field the index keeps emits an event, and Redis is read after that event was written, so once
the archiver has caught up each row holds the job's state as of at least its latest event.
A job whose hash is gone is deleted from the table; one whose hash expires with no event
afterwards (a finished job's retention) stays until a listing shows it no longer exists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from rsched.archive.events import Entry, job_of_event_run
from rsched.core.last_run import fold, plain_run
from rsched.core.layout import JB, OWN
from rsched.core.models import Listed, listed
from rsched.core.wire import EV_EVENT, EV_JOB, EV_RUN, EV_TIME, parse_sid
from rsched.rdb import keys
from rsched.rdb.job_reads import (
    op_histories,
    op_index_reads,
    op_jobs_exist,
    op_run_states,
    op_scan_jobs,
)
from rsched.rdb.ops import Masters, Op

NO_NEXT_MS = 2**63 - 1
"""``next_ms`` of a job with no next run: it sorts after every other job by next run."""
INDEX_HISTORY = 2
"""History records read for a job whose latest run's hash has expired: its state is there."""
# The own run's id, state, ended_ms and started_ms, as core.last_run.fold reads them.
_OWN = (JB.own_run, OWN.state.encode(), OWN.ended_ms.encode(), OWN.started_ms.encode())
_SETS_KEY = frozenset({b"scheduled", b"updated"})  # events after which the spec is read


class JobRow(NamedTuple):
    """One row of ``jobs``, in the migration's column order."""

    job_id: str
    part: int
    job_type: str
    queue: str
    status: str
    next_ms: int
    created_ms: int
    updated_ms: int
    last_run_status: str | None
    last_run_ms: int
    idem_key: str | None  # None: not read this time (kept as stored)
    sid_ms: int
    sid_seq: int


JOB_COLUMNS = JobRow._fields


class Touched(NamedTuple):
    """A job a batch names: its partition, the id of its latest event in the batch, whether an
    event may have set its idempotency key (its spec is read then), and its latest run event
    when that one says the run's state (run id, then the run hash's state, ended_ms and
    started_ms as fold reads them)."""

    part: int
    sid_ms: int
    sid_seq: int
    spec: bool
    run: tuple[str, list[Any]] | None = None


# Run events after which the run's hash holds a state known from the event alone (the scripts
# write both in one call), with the event's time as its ended_ms or started_ms.  When a job's
# latest run event in a batch is one of these and names the job's latest run, its run hash is
# not read: a later change of the run is a later event, applied with a later batch.
_RUN_STATE = {b"dispatched": ("dispatched", None), b"started": ("running", 2),
              b"succeeded": ("succeeded", 1), b"retry_scheduled": ("retry_wait", 1),
              b"dead_lettered": ("dead", 1)}


class JobChanges(NamedTuple):
    """What a batch writes to ``jobs``: rows to upsert, and (job id, sid_ms, sid_seq) of jobs
    Redis no longer holds, to delete; both only where the row holds no later event."""

    rows: list[JobRow]
    gone: list[tuple[str, int, int]]


def touched_jobs(entries: Sequence[Entry]) -> dict[str, Touched]:
    """The jobs the entries' events name (by 'j', or the run id's job), each once."""
    out: dict[str, Touched] = {}
    for part, sid, flat in entries:
        it = iter(flat)
        f: dict[bytes, bytes] = dict(zip(it, it, strict=False))
        raw, run = f.get(EV_JOB), f.get(EV_RUN)
        try:
            run_id = run.decode() if run else None
            job_id = raw.decode() if raw else job_of_event_run(run_id)
        except UnicodeDecodeError:
            continue  # no job of ours has such an id
        if not job_id:
            continue
        ms, seq = parse_sid(sid)
        event = f.get(EV_EVENT)
        spec = event in _SETS_KEY
        prev = out.get(job_id)
        said = prev.run if prev is not None else None
        if run_id:
            known = _RUN_STATE.get(event or b"")
            said = None
            if known is not None:
                state, at = known
                fields: list[Any] = [state, None, None]
                if at is not None:
                    fields[at] = f.get(EV_TIME)
                said = (run_id, fields)
        if prev is not None:
            spec = spec or prev.spec
            if (ms, seq) < (prev.sid_ms, prev.sid_seq):  # entries come in order: never, but
                ms, seq, said = prev.sid_ms, prev.sid_seq, prev.run  # keep the latest
        out[job_id] = Touched(part, ms, seq, spec, said)
    return out


def op_job_changes(touched: dict[str, Touched]) -> Op[JobChanges]:
    """Read the touched jobs' current state from Redis and turn it into rows: their hashes,
    then the state of each one's latest run where that has a hash of its own, then (rarely)
    the history of those whose latest run's hash has expired."""
    names = list(touched)
    got = yield from op_index_reads([(touched[j].part, j, touched[j].spec) for j in names])
    found: list[tuple[str, Listed, Touched, list[Any]]] = []
    gone = []
    for job_id, h in zip(names, got, strict=True):
        t = touched[job_id]
        if JB.type not in h:
            gone.append((job_id, t.sid_ms, t.sid_seq))
        else:
            found.append((job_id, listed(h, job_id), t, [h.get(k) for k in _OWN]))
    latest: dict[int, list[Any]] = {}
    plain = []
    for i, (_, job, t, own) in enumerate(found):
        rid = plain_run(job.last_run_id, own[0])
        if rid is None:
            continue
        if t.run is not None and t.run[0] == rid:
            latest[i] = t.run[1]
        else:
            plain.append(i)
    states = yield from op_run_states([(found[i][2].part, found[i][1].last_run_id or "")
                                       for i in plain])
    latest.update(zip(plain, states, strict=True))
    # A latest run with no state left (its hash expired): its newest history record tells.
    expired = [i for i, (_, job, _, own) in enumerate(found) if job.last_run_id
               and (latest[i][0] if i in latest else own[1]) is None]
    records = yield from op_histories([(found[i][2].part, found[i][0]) for i in expired],
                                      INDEX_HISTORY)
    hist = dict(zip(expired, records, strict=True))
    rows = []
    for i, (job_id, job, t, own) in enumerate(found):
        last = fold(job.last_run_id, own, latest.get(i),
                    [json.loads(x) for x in hist.get(i, ())], INDEX_HISTORY)
        rows.append(JobRow(job_id, t.part, job.type, job.queue, job.status,
                           job.next_ms or NO_NEXT_MS, job.created_ms, job.updated_ms,
                           last.status, last.at_ms or 0, job.idempotency_key,
                           t.sid_ms, t.sid_seq))
    return JobChanges(rows, gone)


SCAN_COUNT = 1000  # job keys a scan step asks SCAN for
SWEEP_ROWS = 2000  # rows a sweep step checks


class IndexScan:
    """Fills the index with the jobs no applied event named: a deployment whose jobs predate
    its archive (or this index), or whose events were trimmed before an archiver read them.
    One SCAN step over the job keys at a time (each master of a cluster in turn); each job
    found is read as a batch's jobs are and inserted only where the index has no row (at
    stream id 0-0, so any event of the job replaces it).  ``done`` once every master is read.
    """

    def __init__(self) -> None:
        self.node = 0
        self.at = 0
        self.done = False

    def op_step(self) -> Op[list[JobRow]]:
        masters = yield Masters()
        self.at, names = yield from op_scan_jobs(self.at, SCAN_COUNT,
                                                 self.node if masters > 1 else None)
        if self.at == 0:
            self.node += 1
            self.done = self.node >= masters
        touched = {}
        for name in names:
            job_id = keys.job_id_of(name)
            head, _, _ = job_id.partition("-")
            if head.isdigit():
                touched[job_id] = Touched(int(head), 0, 0, True)
        return (yield from op_job_changes(touched)).rows


class IndexSweep:
    """Deletes the rows of jobs Redis no longer holds though no event said so (a finished
    job's hash expires after its retention): one step checks the next SWEEP_ROWS rows by job
    id, round and round.  A row is deleted only as it was read, so a job created again
    meanwhile (its event applied) keeps its row."""

    def __init__(self) -> None:
        self.after = ""

    def op_step(self, rows: list[tuple[str, int, int, int]]) -> Op[list[tuple[str, int, int]]]:
        """Of ``rows`` (store.job_ids_after), those whose job is gone."""
        self.after = rows[-1][0] if len(rows) == SWEEP_ROWS else ""
        there = yield from op_jobs_exist([(p, j) for j, p, _, _ in rows])
        return [(j, ms, seq) for (j, _, ms, seq), ok in zip(rows, there, strict=True) if not ok]


__all__ = ["INDEX_HISTORY", "IndexScan", "IndexSweep", "JOB_COLUMNS", "JobChanges", "JobRow",
           "NO_NEXT_MS", "SCAN_COUNT", "SWEEP_ROWS", "Touched", "op_job_changes", "touched_jobs"]
