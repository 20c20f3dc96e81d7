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
from rsched.core.last_run import LastRun, fold, plain_run
from rsched.core.layout import JB, OWN
from rsched.core.models import Job
from rsched.core.wire import EV_EVENT, EV_JOB, EV_RUN, parse_sid
from rsched.rdb.job_reads import op_index_reads, op_run_states
from rsched.rdb.ops import Op

NO_NEXT_MS = 2**63 - 1
"""``next_ms`` of a job with no next run: it sorts after every other job by next run."""
INDEX_HISTORY = 2
"""History records read per job: the latest run's state once its own hash has expired."""
# The own run's state, ended_ms and started_ms, as core.last_run.fold reads them.
_OWN_STATE = (OWN.state.encode(), OWN.ended_ms.encode(), OWN.started_ms.encode())
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
    """A job a batch names: its partition, the id of its latest event in the batch, and
    whether an event may have set its idempotency key (its spec is read then)."""

    part: int
    sid_ms: int
    sid_seq: int
    spec: bool


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
        raw = f.get(EV_JOB)
        try:
            job_id = raw.decode() if raw else job_of_event_run(
                f[EV_RUN].decode() if EV_RUN in f else None)
        except UnicodeDecodeError:
            continue  # no job of ours has such an id
        if not job_id:
            continue
        ms, seq = parse_sid(sid)
        spec = f.get(EV_EVENT) in _SETS_KEY
        prev = out.get(job_id)
        if prev is not None:
            spec = spec or prev.spec
            if (ms, seq) < (prev.sid_ms, prev.sid_seq):
                ms, seq = prev.sid_ms, prev.sid_seq
        out[job_id] = Touched(part, ms, seq, spec)
    return out


def row_of(job: Job, last: LastRun, part: int, sid: tuple[int, int]) -> JobRow:
    return JobRow(job.id, part, job.type, job.queue, job.status.value,
                  job.next_ms or NO_NEXT_MS, job.created_ms, job.updated_ms, last.status,
                  last.at_ms or 0, job.idempotency_key, *sid)


def op_job_changes(touched: dict[str, Touched]) -> Op[JobChanges]:
    """Read the touched jobs' current state from Redis and turn it into rows."""
    names = list(touched)
    got = yield from op_index_reads(
        [(touched[j].part, j, touched[j].spec) for j in names], INDEX_HISTORY)
    found: list[tuple[Job, Touched, dict[bytes, Any], list[bytes]]] = []
    gone = []
    for job_id, (h, hist) in zip(names, got, strict=True):
        t = touched[job_id]
        if JB.type not in h:
            gone.append((job_id, t.sid_ms, t.sid_seq))
        else:
            found.append((Job.from_hash(h, job_id), t, h, hist))
    plain = [i for i, (job, _, h, _) in enumerate(found) if plain_run(job, h.get(JB.own_run))]
    states = yield from op_run_states([(found[i][1].part, found[i][0].last_run_id or "")
                                       for i in plain])
    latest = dict(zip(plain, states, strict=True))
    rows = []
    for i, (job, t, h, hist) in enumerate(found):
        own = [h.get(JB.own_run), *(h.get(k) for k in _OWN_STATE)]
        last = fold(job, own, latest.get(i), [json.loads(x) for x in hist], INDEX_HISTORY)
        rows.append(row_of(job, last, t.part, (t.sid_ms, t.sid_seq)))
    return JobChanges(rows, gone)


__all__ = ["INDEX_HISTORY", "JOB_COLUMNS", "JobChanges", "JobRow", "NO_NEXT_MS", "Touched",
           "op_job_changes", "row_of", "touched_jobs"]
