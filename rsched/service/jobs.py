"""Reading and controlling one job or run: get, its runs and Redis's history of its attempts,
pause, resume, cancel, trigger and replay.  Each operation is written once, as an Op."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rsched.core import defaults
from rsched.core.codes import ControlCode
from rsched.core.errors import Conflict, NotFound, ValidationError, VersionMismatch
from rsched.core.ids import run_id as make_run_id
from rsched.core.layout import JB
from rsched.core.models import (
    Attempt,
    Job,
    JobStatus,
    Overlap,
    Run,
    RunState,
    job_of_run,
    partition_of,
    run_fields,
)
from rsched.core.spec import due_score, next_occurrence
from rsched.rdb import job_scripts, keys
from rsched.rdb.job_reads import (
    op_dead_newest,
    op_dead_scores,
    op_hashes,
    op_history,
    op_job_hash,
    op_run_hashes,
)
from rsched.rdb.job_scripts import ControlReply
from rsched.rdb.ops import Op, Scripts, one
from rsched.rdb.scripts import Call
from rsched.service.context import Service, op_wake

# Before an outcome; 'waiting': held by its limit key (core.limits), shown with the limit's name.
INFLIGHT_STATES = frozenset({"dispatched", "running", "retry_wait", "waiting"})


def op_get(job_id: str) -> Op[Job]:
    h = yield from op_job_hash(job_id)
    if not h:
        raise NotFound("job", job_id)
    return Job.from_hash(h, job_id)


def op_read_runs(run_ids: Sequence[str]) -> Op[list[Run | None]]:
    """Runs by id, in one round trip (None: no such run).  A run's fields are in its own
    hash or, for a one-off job's own run, in the job hash (models.run_fields): both are read."""
    out: list[Run | None] = []
    for rid, (run_hash, job_hash) in zip(run_ids, (yield from op_run_hashes(run_ids)),
                                         strict=True):
        h = run_fields(rid, run_hash, job_hash)
        out.append(Run.from_hash(h, rid) if h else None)
    return out


def op_read_run(run_id: str) -> Op[Run | None]:
    """The run, None when there is no such run (yet, or any more)."""
    (run,) = yield from op_read_runs([run_id])
    return run


def op_get_run(run_id: str) -> Op[Run]:
    run = yield from op_read_run(run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


AttemptKey = tuple[int, int, str]


def attempt_key(a: Attempt) -> AttemptKey:
    """Where a finished attempt sorts in a job's history, newest first: (ended ms, attempt,
    run id), descending; the run id breaks ties, so no two attempts share a key."""
    return (a.ended_ms or 0, a.attempt, a.run_id)


def op_runs(job_id: str, limit: int = defaults.PAGE_LIMIT, offset: int = 0,
            after: AttemptKey | None = None) -> Op[list[Attempt]]:
    """The job's in-flight run (first page only) then its finished attempts, newest first, as
    Redis keeps them (a bounded list); ``offset`` counts finished attempts already seen, or
    ``after`` is the key (attempt_key) of the last one seen: those after it in the order."""
    first = offset == 0 and after is None
    p = partition_of(job_id)
    jh = yield from op_job_hash(job_id)
    if not jh:
        raise NotFound("job", job_id)
    job = Job.from_hash(jh, job_id)
    out: list[Attempt] = []
    own: list[Attempt] = []
    own_run = jh.get(JB.own_run, b"").decode()
    reads = [r for r in dict.fromkeys((job.last_run_id, own_run)) if r]
    if reads:
        # The own run's fields are in the job hash (lua/include/util.lua): no read for it.
        hashes = yield from op_hashes([keys.run(p, rid) for rid in reads if rid != own_run])
        got = iter(hashes)
        for rid in reads:
            h = run_fields(rid, {} if rid == own_run else next(got), jh)
            if not h:
                continue
            run = Run.from_hash(h, rid)
            if rid == job.last_run_id and first and run.state.value in INFLIGHT_STATES:
                why = run.error
                if run.state is RunState.WAITING:
                    why = f"waiting for limit {run.waiting_for}"
                out.append(Attempt(run.id, run.attempt, run.state.value, run.worker,
                                   run.sched_ms, run.started_ms, None, None, why))
            if rid == own_run and run.state.value == "succeeded":
                # lua/complete.lua keeps no separate record of this attempt: the run is it.
                own.append(Attempt(run.id, run.attempt, "succeeded", run.worker, run.sched_ms,
                                   run.started_ms, run.ended_ms, run.duration_ms, None,
                                   run.result))
    want = max(limit - len(out), 0)
    if want:
        # A one-off job's own run keeps its attempts in the job hash (lua/include/util.lua);
        # other runs' attempts are in the history list.  Both newest first, merged.
        own += [Attempt.from_json(v) for k, v in jh.items() if k.startswith(b"h:")]
        raws = yield from op_history(p, job_id, offset + want if after is None else None)
        done = own + [Attempt.from_json(raw) for raw in raws]
        done.sort(key=attempt_key, reverse=True)
        if after is not None:
            done = [a for a in done if attempt_key(a) < after]
        out += done[offset : offset + want]
    return (yield from _mark_dead(p, out[:limit]))


def _mark_dead(p: int, attempts: list[Attempt]) -> Op[list[Attempt]]:
    """Flag the newest attempt (on this page) of each run that is a dead letter now, so a job's
    page can say dead, not failed, and offer Replay: one ZSCORE per run that did not succeed."""
    ids = list(dict.fromkeys(a.run_id for a in attempts if a.status != "succeeded"))
    if not ids:
        return attempts
    scores = yield from op_dead_scores(p, ids)
    dead = {rid for rid, score in zip(ids, scores, strict=True) if score is not None}
    out = []
    for a in attempts:
        if a.run_id in dead:
            dead.discard(a.run_id)
            a = replace(a, dead_lettered=True)
        out.append(a)
    return out


def op_dead_letters(svc: Service, limit: int = 100) -> Op[list[Run]]:
    """Dead-lettered runs across all partitions, most recent first."""
    P = yield from svc.op_partitions()
    entries = sorted(((score, rid) for rid, score in (yield from op_dead_newest(P, limit))),
                     reverse=True)[:limit]
    runs = yield from op_read_runs([rid for _, rid in entries])
    return [run for run in runs if run is not None]


# --- control -------------------------------------------------------------------------------------


MAX_NOTE_CHARS = 1000


def check_note(note: Any) -> str:
    """A pause or resume note as stored ('' for none)."""
    if note is None:
        return ""
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ValidationError("note", f"must be a string of at most {MAX_NOTE_CHARS} characters")
    return note


def op_control(job_id: str, call: Call, if_match: int | None = None) -> Op[Job]:
    """A pause, cancel or resume call (rdb.job_scripts) on one job; the job as it is
    afterwards."""
    name = call[0]
    code, status = ControlReply.of(one((yield Scripts([call], durable=True))))
    if code == ControlCode.NOT_FOUND:
        raise NotFound("job", job_id)
    if code == ControlCode.VERSION:
        raise VersionMismatch(if_match or 0, "")
    if code == ControlCode.REFUSED:
        raise Conflict("status", f"cannot {name} a job that is {status}")
    return (yield from op_get(job_id))


def op_pause(svc: Service, job_id: str, if_match: int | None = None, by: str = "",
             note: str | None = None) -> Op[Job]:
    """Stop future occurrences; a run in progress finishes.  ``by`` and ``note`` are kept with
    the time in the job (Job.paused)."""
    text = check_note(note)
    call = job_scripts.pause(job_id, svc.settings.events_maxlen, if_match, by, text)
    return (yield from op_control(job_id, call, if_match))


def op_cancel(svc: Service, job_id: str, if_match: int | None = None) -> Op[Job]:
    """Stop the job for good; a run in progress finishes, pending retries are abandoned."""
    call = job_scripts.cancel(job_id, svc.settings.events_maxlen, if_match,
                              svc.settings.finished_ttl_ms)
    return (yield from op_control(job_id, call, if_match))


def op_resume(svc: Service, job_id: str, if_match: int | None = None, by: str = "",
              note: str | None = None) -> Op[Job]:
    """Resume a paused job; a cron job's next run is computed from now (inside its startAt and
    endAt; one with no occurrence or run left completes).  ``by`` and ``note`` as for pause."""
    text = check_note(note)
    job = yield from op_get(job_id)
    if if_match is not None and job.version != if_match:
        raise VersionMismatch(if_match, f"it is at {job.version}")
    if job.status is not JobStatus.PAUSED:
        if job.status is JobStatus.SCHEDULED:
            return job
        raise Conflict("status", f"cannot resume a job that is {job.status.value}")
    if job.cron:
        now = yield from svc.op_now()
        nominal, score = next_occurrence(job.cron, job.tz, now, job.id, job.jitter_ms,
                                         job.priority, job.life)
        if job.remaining_runs == 0:
            nominal, score = 0, 0
    else:
        nominal = job.next_ms or 0
        score = due_score(nominal, job.priority)
    call = job_scripts.resume(job_id, svc.settings.events_maxlen, nominal, score, if_match, by,
                              text)
    job = yield from op_control(job_id, call, if_match)
    yield from op_wake([job.partition])
    return job


def op_trigger(svc: Service, job_id: str) -> Op[str]:
    """Run the job once now, outside its schedule; the new run's id."""
    p = partition_of(job_id)
    now = yield from svc.op_now()
    rid = make_run_id(job_id, now)
    code, status = ControlReply.of(one((yield Scripts(
        [job_scripts.trigger(job_id, rid, now, svc.settings.events_maxlen)], durable=True))))
    if code == ControlCode.NOT_FOUND:
        raise NotFound("job", job_id)
    if code == ControlCode.REFUSED:
        raise Conflict("status", f"cannot trigger a job that is {status}")
    yield from op_wake([p])
    return rid


def op_replay(svc: Service, run_id: str) -> Op[Run]:
    """Send a dead letter back for a new round of attempts (attempts counted from zero)."""
    if "@" not in run_id:
        raise ValidationError("runId", f"not a run id: {run_id!r}")
    job_id = job_of_run(run_id)
    p = partition_of(job_id)
    h = yield from op_job_hash(job_id)  # its overlap policy (a job's gone hash: refused below)
    overlap = Job.from_hash(h, job_id).overlap if h else Overlap.ALLOW
    code, state = ControlReply.of(one((yield Scripts(
        [job_scripts.replay(run_id, svc.settings.events_maxlen, overlap)], durable=True))))
    if code == ControlCode.NOT_FOUND:
        raise NotFound("dead letter", run_id)
    if code == ControlCode.REFUSED:
        raise Conflict("status", "the job was cancelled; cancel is final")
    if code == ControlCode.OVERLAP:
        raise Conflict("runId", f"{state}: replay it once that run has ended")
    if code == ControlCode.ALREADY and state not in ("retry_wait", "buffered"):
        raise Conflict("runId", f"run is {state}, not dead-lettered")
    yield from op_wake([p])
    return (yield from op_get_run(run_id))
