"""Backfill: run a recurring job's occurrences in a past time range, each once, with its nominal
time, under the backfill's overlap policy (lua/backfill.lua decides each one in Redis): by
default bufferAll, one after another, never beside a run of the job.

A run id is ``<job id>@<nominal ms>``, so an occurrence has one run hash whoever runs it: the
dispatcher, a trigger or a backfill.  The script leaves an occurrence alone when that hash exists,
and claim.lua does not dispatch an occurrence a backfill ran.  Run hashes of finished runs expire
(``run_ttl_ms``), so a range in which the dispatcher may have run occurrences whose records are
gone is refused rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rsched.core import defaults
from rsched.core.codes import BackfillCode, BackfillRun
from rsched.core.cron import parse_cron
from rsched.core.errors import Conflict, NotFound, ValidationError
from rsched.core.ids import run_id as make_run_id
from rsched.core.models import BackfillOverlap, partition_of
from rsched.core.times import ms_to_iso
from rsched.rdb import job_scripts
from rsched.rdb.job_scripts import BackfillReply
from rsched.rdb.ops import Blocking, Op, Scripts
from rsched.rdb.scripts import Call
from rsched.service.context import Service, op_wake
from rsched.service.inputs import backfill_overlap
from rsched.service.jobs import op_get


@dataclass(slots=True)
class Backfill:
    """What a backfill found: every occurrence in the range and what became of each (a dry
    run: what would), by nominal ms."""

    job_id: str
    from_ms: int
    to_ms: int
    dry_run: bool
    times: list[int]
    overlap: BackfillOverlap
    queued: list[int] = field(default_factory=list)
    existing: list[int] = field(default_factory=list)  # a run of it existed: not run again
    skipped: list[int] = field(default_factory=list)  # by the overlap policy
    buffered: list[int] = field(default_factory=list)


def occurrences(cron: str, tz: str, from_ms: int, to_ms: int,
                limit: int = defaults.BACKFILL_MAX) -> list[int]:
    """The schedule's nominal times in [from_ms, to_ms); ValidationError naming ``to`` when
    there are more than ``limit``."""
    sched = parse_cron(cron, tz)
    out: list[int] = []
    t = sched.next_after(from_ms - 1)
    while t < to_ms:
        if len(out) == limit:
            raise ValidationError("to", f"the range holds more than {limit:,} occurrences; "
                                        "backfill it in parts")
        out.append(t)
        t = sched.next_after(t)
    return out


def check_range(from_ms: int, to_ms: int, now_ms: int) -> None:
    if from_ms >= to_ms:
        raise ValidationError("from", "must be before the end of the range")
    if to_ms > now_ms:
        raise ValidationError("to", f"must not be in the future (now is {ms_to_iso(now_ms)}): "
                                    "the dispatcher runs later occurrences")


def _check_records(svc: Service, created_ms: int, times: list[int], now_ms: int) -> None:
    """Refuse occurrences the dispatcher may have run whose run hashes may have expired: after
    the job's creation and more than run_ttl_ms ago (a finished run's hash lives that long
    after it ends)."""
    ttl = svc.settings.run_ttl_ms
    if ttl <= 0:
        return
    horizon = now_ms - ttl
    unsure = [t for t in times if created_ms < t < horizon]
    if unsure:
        raise ValidationError(
            "from", f"occurrences from {ms_to_iso(unsure[0])} to {ms_to_iso(unsure[-1])} fall "
            f"after the job's creation and before {ms_to_iso(horizon)}: the dispatcher may have "
            "run them and their run records are kept only RSCHED_RUN_TTL_MS, so a backfill "
            "could run them twice; give a later from")


def op_backfill(svc: Service, job_id: str, from_ms: int, to_ms: int, dry_run: bool = False,
                overlap: BackfillOverlap | str = defaults.BACKFILL_OVERLAP) -> Op[Backfill]:
    """Run each occurrence of the job's schedule in [from_ms, to_ms) that has no run yet, under
    ``overlap`` (BackfillOverlap), in one round trip of chunked script calls (bufferAll: one a
    chunk, each chunk's runs queued behind the last one's).  With ``dry_run``, backfill.lua
    decides each occurrence the same way and writes nothing: the answer says what a backfill
    would do now."""
    policy = backfill_overlap(overlap)
    now = yield from svc.op_now()
    check_range(from_ms, to_ms, now)
    job = yield from op_get(job_id)
    if not job.cron:
        raise ValidationError("id", f"job {job_id} is a one-off job; only a recurring job "
                                    "(cron) can be backfilled")
    # The job's own window (startAt, endAt inclusive) bounds its schedule, backfills included.
    life = job.life
    lo = max(from_ms, life.start_at_ms)
    hi = min(to_ms, life.end_at_ms + 1) if life.end_at_ms else to_ms
    # Up to BACKFILL_MAX cron steps (about 0.2 s for 10,000): off the API's event loop.
    times = (yield Blocking(partial(occurrences, job.cron, job.tz, lo, hi))) if lo < hi else []
    out = Backfill(job_id, from_ms, to_ms, dry_run, times, policy)
    _check_records(svc, job.created_ms, times, now)
    chunks = [times[c : c + defaults.BACKFILL_CHUNK]
              for c in range(0, len(times), defaults.BACKFILL_CHUNK)]
    if dry_run:
        # One round trip per chunk: each starts from the active and buffered runs the
        # previous chunk's decisions leave, which no dry call writes.
        state = "="
        for chunk in chunks:
            (res,) = yield Scripts([_call(svc, policy, job_id, chunk, state)])
            reply = _record(out, job_id, chunk, res)
            state = f"{reply.active}|{reply.buffered}"
        return out
    if policy is BackfillOverlap.BUFFER_ALL:
        yield from _buffer_all(svc, out, chunks)
    else:
        results = yield Scripts((_call(svc, policy, job_id, chunk, "") for chunk in chunks),
                                durable=True)
        for chunk, res in zip(chunks, results, strict=True):
            _record(out, job_id, chunk, res)
    if out.queued:
        yield from op_wake([partition_of(job_id)])
    return out


TAIL_TRIES = 5  # calls of one chunk while other bufferAll backfills of the job change its queue


def _buffer_all(svc: Service, out: Backfill, chunks: list[list[int]]) -> Op[None]:
    """bufferAll: each chunk's runs queue behind the last run the one before queued (the job's
    'bq_tail'), so one call a chunk; a call that finds another tail (another bufferAll backfill
    of the job came between) is made again behind it."""
    tail = ""
    for chunk in chunks:
        for _ in range(TAIL_TRIES):
            (res,) = yield Scripts([_call(svc, out.overlap, out.job_id, chunk, "", tail)],
                                   durable=True)
            if isinstance(res, Exception) or int(res[0]) != BackfillCode.OTHER_TAIL:
                break
            tail = BackfillReply.of(res, 0).status
        else:
            raise Conflict("overlap", "other bufferAll backfills of this job changed its queue "
                                      f"{TAIL_TRIES} times meanwhile; try again")
        reply = _record(out, out.job_id, chunk, res)
        made = [t for t, c in zip(chunk, reply.runs, strict=True)
                if c in (BackfillRun.QUEUED, BackfillRun.BUFFERED)]
        if made:
            tail = make_run_id(out.job_id, made[-1])


def _record(out: Backfill, job_id: str, chunk: list[int], res: Any) -> BackfillReply:
    """File each occurrence of one backfill.lua call under what became of it."""
    if isinstance(res, Exception):
        raise res
    reply = BackfillReply.of(res, len(chunk))
    if reply.code == BackfillCode.NOT_FOUND:
        raise NotFound("job", job_id)
    if reply.code == BackfillCode.REFUSED:
        raise Conflict("status", f"cannot backfill a job that is {reply.status}")
    by_code = {BackfillRun.QUEUED: out.queued, BackfillRun.EXISTS: out.existing,
               BackfillRun.SKIPPED: out.skipped, BackfillRun.BUFFERED: out.buffered}
    for t, c in zip(chunk, reply.runs, strict=True):
        by_code[c].append(t)
    return reply


def _call(svc: Service, overlap: BackfillOverlap, job_id: str, chunk: list[int], dry: str,
          tail: str = "") -> Call:
    """One backfill.lua call over a chunk of at most BACKFILL_CHUNK occurrences (bounded
    arguments, short pauses of Redis); ``dry`` as its ARGV[6], ``tail`` its ARGV[8]."""
    s = svc.settings
    return job_scripts.backfill(job_id, s.events_maxlen, s.run_ttl_ms, s.history_len, overlap,
                                chunk, dry, tail)
