"""Writing jobs: schedule (batched script calls per partition) and update (compare-and-set)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import chain
from typing import Any

from rsched.core import defaults
from rsched.core.codes import ControlCode, ScheduleCode
from rsched.core.errors import Conflict, NotFound, NotReplicated, RschedError, VersionMismatch
from rsched.core.ids import (
    dedup_partition,
    keyed_job_id,
    partition_for_key,
    random_job_ids,
    random_partition,
)
from rsched.core.layout import JB, J
from rsched.core.limits import check_key as check_limit_key
from rsched.core.models import Job, JobStatus, partition_of, with_run_at
from rsched.core.spec import (
    OWN_FIELDS,
    SHARED_FIELDS,
    JobSpec,
    Prepared,
    check_dedup,
    check_idempotency_key,
    due_score,
    jitter_offset_ms,
    prepare,
)
from rsched.core.tally import SCHEDULED
from rsched.rdb import job_scripts, keys, schedule_script
from rsched.rdb.job_reads import op_hashes, op_job_hash
from rsched.rdb.job_scripts import ControlReply
from rsched.rdb.ops import Op, Scripts, one
from rsched.rdb.schedule_script import DedupArgs, ScheduleReply
from rsched.rdb.scripts import Call
from rsched.service.context import Service, op_wake
from rsched.service.jobs import op_get
from rsched.service.patch import JobPatch

UPDATE_TRIES = 5  # re-reads when a dispatcher advances a job between an update's read and write
DEDUP_TRIES = 5  # calls again when a dedup record names a job the last call did not

# The limit key stays too: it placed the job in its partition.
_FIXED_FIELDS = frozenset({J.type, J.queue, J.status, J.next_ms, J.limit_key})

_Layout = tuple[int, list[int], list[tuple[Any, int]]]  # partition, spec indexes, groups
_Run = tuple[int, Sequence[int], list[str] | None, bool]  # partition, spec indexes, ids
# (None: random ids drawn as the call is built), whether its jobs carry a dedup window


def op_schedule_many(svc: Service, specs: Sequence[JobSpec]) -> Op[list[Job | RschedError]]:
    """Each spec's job, or its own error."""
    out, _ = yield from op_schedule(svc, specs)
    return out


def op_schedule_created(
    svc: Service, specs: Sequence[JobSpec]
) -> Op[list[tuple[Job, bool] | RschedError]]:
    """Like op_schedule_many, with each job paired with True if this call created it."""
    out, created = yield from op_schedule(svc, specs)
    return [r if isinstance(r, RschedError) else (r, c)
            for r, c in zip(out, created, strict=True)]


def op_schedule(
    svc: Service, specs: Sequence[JobSpec]
) -> Op[tuple[list[Job | RschedError], list[bool]]]:
    """Each spec's job or error, and whether this call created the job.

    Written to leave few objects per job alive until the batch ends (parallel lists, no
    per-job tuples): at 100,000 jobs the garbage collector, which walks every live container
    again and again, cost as much as all the rest of the client's work."""
    n = len(specs)
    out: list[Job | RschedError | None] = [None] * n
    created = [False] * n
    now = yield from svc.op_now()
    P = yield from svc.op_store_partitions()
    runs: list[_Run] = []
    p, at = random_partition(P), 0
    for run in call_sizes(n, svc.streams_calls):  # consecutive partitions: batches spread evenly
        runs.append((p, range(at, at + run), None, False))
        p, at = (p + 1) % P, at + run
    layout: list[_Layout] = []
    checked: dict[int, JobSpec] = {}  # the specs with a dedup window, checked
    calls = _calls(svc, specs, runs, P, now, out, created, layout, checked)
    results = yield Scripts(calls, durable=True)
    wake: set[int] = set()
    existing: list[tuple[int, int, str, bool]] = []  # (spec index, partition, id, answered by
    # a dedup window) of jobs found
    tally: list[tuple[Any, int]] = []  # ((type, queue), how many such jobs were created)
    again = _read_replies(layout, results, out, created, wake, existing, tally)
    for _ in range(DEDUP_TRIES):
        if not again:
            break
        layout = []
        calls = _calls(svc, checked, _again_calls(again, out), P, now, out, created, layout,
                       checked, {i: held for i, held in again})
        again = _read_replies(layout, (yield Scripts(calls, durable=True)), out, created, wake,
                              existing, tally)
    for i, _ in again:
        out[i], created[i] = Conflict("dedup.key", "its record kept naming another job; try "
                                      "again"), False
    if existing:
        hashes = yield from op_hashes([keys.job(p, job_id) for _, p, job_id, _ in existing])
        for (i, _, job_id, dedup), h in zip(existing, hashes, strict=True):
            job = out[i] = Job.from_hash(h, job_id)
            job.deduplicated = dedup
    SCHEDULED.add(tally)  # rsched_jobs_scheduled, read by rsched.obs.metrics when scraped
    yield from op_wake(wake)
    return out, created  # type: ignore[return-value]


def _read_replies(layout: list[_Layout], results: list[Any], out: list[Any],
                  created: list[bool], wake: set[int],
                  existing: list[tuple[int, int, str, bool]], tally: list[tuple[Any, int]]
                  ) -> list[tuple[int, str]]:
    """The calls' replies read into ``out`` and ``created``, the partitions to ``wake``, the
    jobs found (read once all calls are done) and the count of those created; returns (spec
    index, job id) of each job whose dedup record named a job its call did not."""
    again: list[tuple[int, str]] = []
    jobs: list[Job] = out  # what a call's spec indexes hold
    for (p, chunk, sizes), res in zip(layout, results, strict=True):
        if isinstance(res, NotReplicated):  # applied: each job's own error says so, by its id
            for i in chunk:
                out[i], created[i] = res.of_job(jobs[i].id), False
            wake.add(p)  # the reply, which said whether to, is lost
            continue
        if isinstance(res, Exception):
            raise res
        reply = ScheduleReply.of(res, len(chunk))
        if reply.wake:
            wake.add(p)
        codes = reply.codes
        if jobs[chunk[0]].idempotency_key is not None:  # keyed ids (a call holds only keyed
            created_ms = reply.now_ms  # or only random ones): Redis's clock, stored (a random
            for i, code in zip(chunk, codes, strict=True):  # id's is `now`)
                if code == ScheduleCode.CREATED:
                    jobs[i].created_ms = jobs[i].updated_ms = created_ms
        if not any(codes):  # the usual case, every job created: out and created say so already
            tally += sizes  # and the metric counts whole groups
            continue
        about = iter(reply.about)
        for i, code in zip(chunk, codes, strict=True):
            job = jobs[i]
            if code == ScheduleCode.CREATED:
                tally.append(((job.type, job.queue), 1))
                continue
            created[i] = False
            if code == ScheduleCode.SAME:
                existing.append((i, p, job.id, False))
            elif code == ScheduleCode.DEDUPLICATED:
                existing.append((i, p, next(about), True))
            elif code == ScheduleCode.HELD_ELSEWHERE:
                again.append((i, next(about)))
            else:
                out[i] = Conflict("idempotencyKey", "already used for a job with a different body")
    return again


def _again_calls(again: list[tuple[int, str]], out: list[Any]) -> Iterator[_Run]:
    """The calls that send the jobs of ``again`` once more, each with the job its record
    named: the ids the first call drew, by partition, keyed and random ones apart."""
    by_call: dict[tuple[int, bool], list[int]] = defaultdict(list)
    for i, _ in again:
        job = out[i]
        by_call[(job.partition, job.idempotency_key is not None)].append(i)
    for (p, _), items in by_call.items():
        yield p, items, [out[i].id for i in items], True


def call_sizes(n: int, streamed: bool = True) -> list[int]:
    """Jobs per script call for ``n`` jobs: equal calls of at most SCHEDULE_CHUNK, after, when
    the calls are ``streamed``, a small first call (SCHEDULE_FIRST_CHUNK) and each next one
    twice as big.  The sync client writes each call as it is built and Redis stores one while
    the next is built, so Redis waits only for the first; Redis takes longer per job than the
    client, hence the doubling.  A call costs Redis about five jobs' work of its own: no small
    calls at the end too,
    which only a client slower than Redis gains by, nor when the calls go in one pipeline once
    all are built."""
    sizes: list[int] = []
    size = defaults.SCHEDULE_FIRST_CHUNK
    while streamed and size < defaults.SCHEDULE_CHUNK and n > 2 * size:
        sizes.append(size)
        n -= size
        size *= 2
    calls = -(-n // defaults.SCHEDULE_CHUNK)
    return sizes + [n * (k + 1) // calls - n * k // calls for k in range(calls)]


def _calls(svc: Service, specs: Sequence[JobSpec] | dict[int, JobSpec],
           runs: list[_Run] | Iterator[_Run], P: int, now: int, out: list[Any],
           created: list[bool], layout: list[_Layout], checked: dict[int, JobSpec],
           guesses: dict[int, str] | None = None) -> Iterator[Call]:
    """Jobs prepared one script call at a time: the sync client sends each call as it comes, so
    Redis stores one chunk while the next is prepared.  ``runs``: (partition, spec indexes,
    None: random ids, drawn as the call is built); a spec with an idempotency key or a limit
    key is left out of its run and goes, with the others, in the keyed calls at the end (no
    pass over the specs before the first call); so is a spec with a dedup window, checked into
    ``checked``.  Fills
    ``out`` with each spec's job (``created`` True) or error, and ``layout`` with (partition,
    spec indexes, group sizes) of each call: the replies then only correct the jobs not
    created.  ``guesses``: spec index -> the job its dedup record named in the last call."""
    max_payload = svc.settings.max_payload_bytes
    keyed: list[int] = []  # filled while the runs are built, read once they are done
    for p, items, job_ids, windowed in chain(runs, _keyed_calls(specs, keyed, P, now, out,
                                                                checked)):
        chunk: list[int] = []
        preps: list[Prepared] = []
        windows: list[DedupArgs] | None = [] if windowed else None
        drawn = random_job_ids(len(items), p, now) if job_ids is None else job_ids
        for i, job_id in zip(items, drawn, strict=True):
            spec = specs[i]
            if job_ids is None:
                if (spec.idempotency_key is not None or spec.dedup is not None
                        or spec.limit_key is not None):
                    keyed.append(i)
                    continue
            elif windowed:
                spec = checked[i]
            try:
                prep = prepare(spec, job_id, now, max_payload)
            except RschedError as e:
                out[i] = e
                continue
            preps.append(prep)
            chunk.append(i)
            out[i] = prep.job
            created[i] = True
            if windows is not None:
                windows.append(DedupArgs(spec.dedup,  # type: ignore[arg-type]  # checked
                                         "" if guesses is None else guesses[i]))
        if preps:
            call, order, sizes = schedule_script.call(p, preps, now, svc.settings.events_maxlen,
                                                      windows)
            if order is not None:
                chunk = [chunk[k] for k in order]
            layout.append((p, chunk, sizes))  # not the prepared jobs: they die here, not later
            yield call


def _keyed_calls(specs: Sequence[JobSpec] | dict[int, JobSpec], keyed: list[int], P: int,
                 now: int, out: list[Any], checked: dict[int, JobSpec]) -> Iterator[_Run]:
    """The calls for the specs with an idempotency key, a dedup window or a limit key: a limit
    key decides the partition (its checks are one script on its slot), else a dedup key does
    (its record and its jobs share a slot), else the idempotency key does, which also gives the
    id; the others' ids are random.  With a limit key a dedup key's record, like an idempotency
    key, is then one per limit key's partition.  Keyed and random ids, and jobs with and
    without a window, go in calls apart.  A bad key or window is the spec's error; a checked
    window goes in ``checked`` (a debounced job is due ttl from now)."""
    by_call: dict[tuple[int, bool, bool], list[int]] = defaultdict(list)
    key_ids: dict[int, str] = {}
    for i in keyed:
        spec = specs[i]
        try:
            p, place = None, None
            if spec.dedup is not None:
                d = check_dedup(spec)
                checked[i] = replace(spec, dedup=d, run_at=now + d.ttl_ms
                                     if d.mode == "debounce" else spec.run_at)
                p, place = dedup_partition(d.key, P), d.key
            if spec.limit_key is not None:
                place = check_limit_key(spec.limit_key)
                p = partition_for_key(place, P)
            if spec.idempotency_key is not None:
                p, key_ids[i] = keyed_job_id(check_idempotency_key(spec.idempotency_key), P,
                                             place)
        except RschedError as e:
            out[i] = e
            continue
        assert p is not None
        by_call[(p, i in key_ids, spec.dedup is not None)].append(i)
    for (p, has_key, windowed), items in by_call.items():
        for c in range(0, len(items), defaults.SCHEDULE_CHUNK):
            chunk = items[c : c + defaults.SCHEDULE_CHUNK]
            yield (p, chunk, [key_ids[i] for i in chunk] if has_key
                   else random_job_ids(len(chunk), p, now), windowed)


def _as_bytes(v: Any) -> bytes:
    """A hash value as stored; an absent field is '' (schedule.lua stores no '' values)."""
    if v is None:
        return b""
    if isinstance(v, bytes):
        return v
    return str(v).encode()


def op_update(svc: Service, job_id: str, patch: JobPatch,
              if_match: int | None = None) -> Op[Job]:
    """Change a scheduled or paused job (update.lua, compare-and-set on what was read; with
    ``if_match``, only at that version)."""
    p = partition_of(job_id)
    for _ in range(UPDATE_TRIES):
        h = yield from op_job_hash(job_id)
        if not h:
            raise NotFound("job", job_id)
        job = Job.from_hash(h, job_id)
        if job.status not in (JobStatus.SCHEDULED, JobStatus.PAUSED):
            raise Conflict("status", f"cannot update a job that is {job.status.value}")
        now = yield from svc.op_now()
        prep = prepare(patch.apply(job), job_id, now, svc.settings.max_payload_bytes)
        if h.get(JB.own_run) and prep.job.run_at_ms:  # its runAt is no longer its first run's
            prep = prep._replace(blob=with_run_at(prep.blob, prep.job.run_at_ms))
        pairs: list[Any] = []
        for k, v in zip(SHARED_FIELDS + OWN_FIELDS, prep.shared() + prep.own(), strict=True):
            if k not in _FIXED_FIELDS and _as_bytes(h.get(k.encode())) != _as_bytes(v):
                pairs += [k, v]
        new_next: Any = ""
        score: Any = ""
        if patch.reschedules:
            new_next, score = prep.next_ms, prep.score
        elif job.next_ms and prep.job.priority != job.priority:
            # Same occurrence, new place among the jobs due in its millisecond.
            jit = 0 if not job.cron else jitter_offset_ms(job_id, job.next_ms, job.jitter_ms)
            new_next = job.next_ms
            score = due_score(job.next_ms + jit, prep.job.priority)
        code, status = ControlReply.of(one((yield Scripts([job_scripts.update(
            job_id, svc.settings.events_maxlen, job.status.value, job.next_ms or 0, new_next,
            score, if_match, pairs)], durable=True))))
        if code == ControlCode.CHANGED:
            continue
        if code == ControlCode.VERSION:
            raise VersionMismatch(if_match or 0, "")
        if code == ControlCode.NOT_FOUND:
            raise NotFound("job", job_id)
        if code == ControlCode.REFUSED:
            raise Conflict("status", f"cannot update a job that is {status}")
        if patch.reschedules:
            yield from op_wake([p])
        return (yield from op_get(job_id))
    raise Conflict("id", "the job kept changing while it was being updated; try again")
