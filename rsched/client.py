"""The Python client: schedule, inspect and control jobs (the service layer the CLI and API use).

Every operation is written once, as a generator that yields the Redis work it needs (`Scripts`
or `Commands`, each one pipeline round trip), receives the results and returns its value.  The
sync `Client` here and the asyncio `rsched.aclient.AsyncClient` only execute what operations
yield, so validation, script arguments and result parsing exist once for both.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, TypeVar

from redis import Redis

from rsched.core.errors import Conflict, NotFound, RschedError, ValidationError
from rsched.core.ids import keyed_job_id, random_job_ids
from rsched.core.ids import run_id as make_run_id
from rsched.core.models import Attempt, Job, JobStatus, Run, job_of_run, partition_of, run_fields
from rsched.core.settings import Settings
from rsched.core.spec import (
    OWN_FIELDS,
    SHARED_FIELDS,
    JobSpec,
    Prepared,
    check_idempotency_key,
    due_score,
    jitter_offset_ms,
    next_occurrence,
    prepare,
)
from rsched.obs import metrics
from rsched.rdb import keys, scripts
from rsched.rdb.setup import _stored as stored_partitions
from rsched.rdb.setup import fast_packing

if TYPE_CHECKING:
    from rsched.archive.history import RunAttempt, RunsPage
    from rsched.archive.store import Store

DEFAULT_PARTITIONS = 16
SCHEDULE_CHUNK = 250  # jobs per script call: bounded argument lists, short Redis pauses
UPDATE_TRIES = 5  # re-reads when a dispatcher advances a job between an update's read and write

T = TypeVar("T")


INFLIGHT_STATES = frozenset({"dispatched", "running", "retry_wait"})  # before an outcome


# --- Redis work an operation yields ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scripts:
    """Run these script calls in one round trip; results (or exceptions) come back in order.
    The calls may be built lazily, while they are sent (see scripts.stream_many)."""

    calls: Iterable[scripts.Call]


@dataclass(frozen=True, slots=True)
class Commands:
    """Run these commands, each ``(method, args, kwargs)`` of redis-py, in one pipeline."""

    cmds: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
    raise_on_error: bool = True


def cmd(method: str, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return (method, args, kwargs)


@dataclass(frozen=True, slots=True)
class Blocking:
    """Call ``fn`` (an archive query) and send back its value; the asyncio client runs it in a
    thread so the event loop never waits on the database."""

    fn: Callable[[], Any]


Work = Scripts | Commands | Blocking
Op = Generator[Work, Any, T]


def one(results: list[Any]) -> Any:
    """The only result of a one-call `Scripts`, raised if it is an error."""
    if isinstance(results[0], Exception):
        raise results[0]
    return results[0]


def fill_pipeline(pipe: Any, work: Commands) -> Any:
    for method, args, kwargs in work.cmds:
        getattr(pipe, method)(*args, **kwargs)
    return pipe


@dataclass(frozen=True, slots=True)
class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class JobPatch:
    """What PATCH /jobs/{id} may change; fields left UNSET keep their stored value.

    Giving ``run_at``, ``cron`` or ``tz`` reschedules: a cron job's next run is computed from now.
    """

    run_at: Any = UNSET
    cron: Any = UNSET
    tz: Any = UNSET
    payload: Any = UNSET
    max_attempts: Any = UNSET
    priority: Any = UNSET

    @property
    def reschedules(self) -> bool:
        return any(v is not UNSET for v in (self.run_at, self.cron, self.tz))

    def apply(self, job: Job) -> JobSpec:
        """The job's spec with this patch applied, to validate and prepare like a new one."""
        if self.run_at is not UNSET and self.cron is not UNSET and self.cron is not None:
            raise ValidationError("runAt", "give either runAt or cron, not both")
        run_at: Any = job.run_at_ms
        cron = job.cron
        if self.cron is not UNSET:
            cron, run_at = self.cron, None
        if self.run_at is not UNSET:
            cron, run_at = None, self.run_at
        return JobSpec(
            type=job.type, payload=job.payload if self.payload is UNSET else self.payload,
            run_at=run_at, cron=cron, tz=job.tz if self.tz is UNSET else self.tz,
            queue=job.queue, backoff_base_ms=job.backoff_base_ms,
            backoff_cap_ms=job.backoff_cap_ms, timeout_ms=job.timeout_ms,
            max_attempts=job.max_attempts if self.max_attempts is UNSET else self.max_attempts,
            priority=job.priority if self.priority is UNSET else self.priority,
            idempotency_key=job.idempotency_key, misfire=job.misfire.value,
            jitter_ms=job.jitter_ms, paused=job.status is JobStatus.PAUSED,
        )


_FIXED_FIELDS = frozenset({"id", "type", "queue", "status", "next_ms"})
_STATUS_AT = SHARED_FIELDS.index("status")
assert OWN_FIELDS == ("id", "next_ms", "spec")  # the order _schedule_call writes them in
assert SHARED_FIELDS[:2] == ("type", "queue")  # what _schedule_call reports group sizes by


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    return str(v).encode()


# --- the operations ----------------------------------------------------------------------------


class ClientBase:
    """Every operation of the service layer, free of I/O; subclasses execute the work."""

    def __init__(self, settings: Settings, archive_url: str | None = None) -> None:
        from rsched.archive.history import configured_url

        self.settings = settings
        self.archive_url = configured_url(archive_url)
        """Run-history store merged into runs (RSCHED_ARCHIVE_URL); None: Redis's history only."""
        self._archive: Store | None = None
        self._partitions: int | None = None
        self._offset_ms = 0
        self._offset_at = 0.0

    # --- plumbing ----------------------------------------------------------------------------

    def op_partitions(self) -> Op[int]:
        if self._partitions is None:
            wanted = self.settings.partitions or DEFAULT_PARTITIONS
            res = yield Commands([cmd("hsetnx", keys.config(), "partitions", wanted),
                                  cmd("hget", keys.config(), "partitions")])
            self._partitions = stored_partitions(res[1], wanted, bool(self.settings.partitions))
        return self._partitions

    def op_now(self) -> Op[int]:
        """Redis's clock, estimated locally from an offset refreshed every 30 s."""
        mono = time.monotonic()
        if mono - self._offset_at > 30 or not self._offset_at:
            before = time.time()
            ((sec, usec),) = yield Commands([cmd("time")])
            after = time.time()
            self._offset_ms = int(sec * 1000 + usec // 1000 - (before + after) * 500)
            self._offset_at = mono
        return int(time.time() * 1000) + self._offset_ms

    def op_wake(self, partitions: Iterable[int]) -> Op[None]:
        ps = set(partitions)
        if ps:
            yield Commands([cmd("publish", keys.wake_channel(), n) for n in ps])

    # --- scheduling --------------------------------------------------------------------------

    def op_schedule_many(self, specs: Sequence[JobSpec]) -> Op[list[Job | RschedError]]:
        out, _ = yield from self._op_schedule(specs)
        return out

    def op_schedule_created(
        self, specs: Sequence[JobSpec]
    ) -> Op[list[tuple[Job, bool] | RschedError]]:
        """Like schedule_many, with each job paired with True if this call created it."""
        out, created = yield from self._op_schedule(specs)
        return [r if isinstance(r, RschedError) else (r, c)
                for r, c in zip(out, created, strict=True)]

    def _op_schedule(
        self, specs: Sequence[JobSpec]
    ) -> Op[tuple[list[Job | RschedError], list[bool]]]:
        """Each spec's job or error, and whether this call created the job.

        Written to leave few objects per job alive until the batch ends (parallel lists, no
        per-job tuples): at 100,000 jobs the garbage collector, which walks every live container
        again and again, cost as much as all the rest of the client's work."""
        out: list[Job | RschedError | None] = [None] * len(specs)
        created = [False] * len(specs)
        now = yield from self.op_now()
        P = yield from self.op_partitions()
        parts, ids = random_job_ids(len(specs), P, spread=-(-len(specs) // SCHEDULE_CHUNK))
        by_part: dict[int, list[int]] = defaultdict(list)
        for i, spec in enumerate(specs):
            key = spec.idempotency_key
            if key is not None:
                try:
                    parts[i], ids[i] = keyed_job_id(check_idempotency_key(key), P)
                except RschedError as e:
                    out[i] = e
                    continue
            by_part[parts[i]].append(i)
        layout: list[tuple[int, list[int], list[Prepared], list[tuple[Any, int]]]] = []

        def calls() -> Iterator[scripts.Call]:
            """Jobs prepared one script call at a time: the sync client sends each call as it
            comes, so Redis stores one chunk while the next is prepared."""
            max_payload = self.settings.max_payload_bytes
            for p, items in by_part.items():
                for c in range(0, len(items), SCHEDULE_CHUNK):
                    chunk: list[int] = []
                    preps: list[Prepared] = []
                    for i in items[c : c + SCHEDULE_CHUNK]:
                        try:
                            preps.append(prepare(specs[i], ids[i], now, max_payload))
                            chunk.append(i)
                        except RschedError as e:
                            out[i] = e
                    if preps:
                        call, order, sizes = self._schedule_call(p, preps)
                        layout.append((p, [chunk[k] for k in order], [preps[k] for k in order],
                                       sizes))
                        yield call

        results = yield Scripts(calls())
        wake: set[int] = set()
        existing: list[int] = []
        tally: list[tuple[Any, int]] = []  # ((type, queue), how many such jobs were created)
        for (p, chunk, preps, sizes), res in zip(layout, results, strict=True):
            if isinstance(res, Exception):
                raise res
            if res[0] == 1:
                wake.add(p)
            created_ms = int(res[1])
            codes = res[2:]
            if any(codes):
                tally += (((prep.job.type, prep.job.queue), 1)
                          for prep, code in zip(preps, codes, strict=True) if code == 0)
            else:  # the usual case, every job created: the metric counts whole groups
                tally += sizes
            for i, prep, code in zip(chunk, preps, codes, strict=True):
                job = prep.job
                if code == 0:
                    job.created_ms = job.updated_ms = created_ms
                    out[i] = job
                    created[i] = True
                elif code == 1:
                    existing.append(i)
                else:
                    out[i] = Conflict(
                        "idempotencyKey", "already used for a job with a different body"
                    )
        if existing:
            hashes = yield Commands([cmd("hgetall", keys.job(parts[i], ids[i]))
                                     for i in existing])
            for i, h in zip(existing, hashes, strict=True):
                out[i] = Job.from_hash(h)
        metrics.count_scheduled(chain.from_iterable(repeat(pair, n) for pair, n in tally))
        yield from self.op_wake(wake)
        return out, created  # type: ignore[return-value]

    def _schedule_call(
        self, p: int, preps: list[Prepared]
    ) -> tuple[scripts.Call, list[int], list[tuple[Any, int]]]:
        """The script call for jobs of partition ``p``, the order it holds them in (indexes
        into ``preps``): grouped by their SHARED_FIELDS values, each group's values sent once,
        and ((type, queue), size) of each group."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for k, prep in enumerate(preps):
            shared = prep.shared()
            group = groups.get(shared)
            if group is None:
                groups[shared] = [k]
            else:
                group.append(k)
        ks = [keys.due(p), keys.events(p), keys.queues(p)]
        job_key = keys.job(p, "")
        args: list[Any] = [0, self.settings.events_maxlen, len(preps), len(SHARED_FIELDS),
                           len(OWN_FIELDS), *SHARED_FIELDS, *OWN_FIELDS]
        order: list[int] = []
        for shared, members in groups.items():
            args.append(len(members))
            args += shared
            paused = shared[_STATUS_AT] == JobStatus.PAUSED.value
            for k in members:  # OWN_FIELDS values written out: a call per job cost 0.2 us
                job, blob, body_hash, next_ms, score = preps[k]
                ks.append(job_key + job.id)
                args += (body_hash, "" if paused else score, job.id, next_ms, blob)
            order += members
        sizes = [(shared[:2], len(members)) for shared, members in groups.items()]
        return ("schedule", ks, args), order, sizes

    def op_update(self, job_id: str, patch: JobPatch) -> Op[Job]:
        """Change a scheduled or paused job (update.lua, compare-and-set on what was read)."""
        p = partition_of(job_id)
        key = keys.job(p, job_id)
        for _ in range(UPDATE_TRIES):
            (h,) = yield Commands([cmd("hgetall", key)])
            if not h:
                raise NotFound("job", job_id)
            job = Job.from_hash(h)
            if job.status not in (JobStatus.SCHEDULED, JobStatus.PAUSED):
                raise Conflict("status", f"cannot update a job that is {job.status.value}")
            now = yield from self.op_now()
            prep = prepare(patch.apply(job), job_id, now, self.settings.max_payload_bytes)
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
            code, status = one((yield Scripts([(
                "update", [key, keys.due(p), keys.events(p)],
                [job_id, 0, self.settings.events_maxlen, job.status.value, job.next_ms or 0,
                 new_next, score, len(pairs) // 2, *pairs],
            )])))
            if code == -3:
                continue
            if code == -1:
                raise NotFound("job", job_id)
            if code == -2:
                raise Conflict("status", f"cannot update a job that is {status.decode()}")
            if patch.reschedules:
                yield from self.op_wake([p])
            return (yield from self.op_get(job_id))
        raise Conflict("id", "the job kept changing while it was being updated; try again")

    # --- reading -----------------------------------------------------------------------------

    def op_get(self, job_id: str) -> Op[Job]:
        (h,) = yield Commands([cmd("hgetall", keys.job(partition_of(job_id), job_id))])
        if not h:
            raise NotFound("job", job_id)
        return Job.from_hash(h)

    def op_read_runs(self, run_ids: Sequence[str]) -> Op[list[Run | None]]:
        """Runs by id, in one round trip (None: no such run).  A run's fields are in its own
        hash or, for a one-off job's own run, in the job hash (models.run_fields): both are read."""
        reads = []
        for rid in run_ids:
            job_id = job_of_run(rid)
            p = partition_of(job_id)
            reads += [cmd("hgetall", keys.run(p, rid)), cmd("hgetall", keys.job(p, job_id))]
        hashes = yield Commands(reads)
        out: list[Run | None] = []
        for i, rid in enumerate(run_ids):
            h = run_fields(rid, hashes[2 * i], hashes[2 * i + 1])
            out.append(Run.from_hash(h, rid) if h else None)
        return out

    def op_get_run(self, run_id: str) -> Op[Run]:
        (run,) = yield from self.op_read_runs([run_id])
        if run is None:
            raise NotFound("run", run_id)
        return run

    def op_runs(self, job_id: str, limit: int = 50, offset: int = 0) -> Op[list[Attempt]]:
        """The job's in-flight run (first page only) then its finished attempts, newest first;
        ``offset`` counts finished attempts already seen."""
        p = partition_of(job_id)
        (jh,) = yield Commands([cmd("hgetall", keys.job(p, job_id))])
        if not jh:
            raise NotFound("job", job_id)
        job = Job.from_hash(jh)
        out: list[Attempt] = []
        own: list[Attempt] = []
        own_run = jh.get(b"own_run", b"").decode()
        reads = [r for r in dict.fromkeys((job.last_run_id, own_run)) if r]
        if reads:
            # The own run's fields are in the job hash (lua/include/util.lua): no read for it.
            hashes = yield Commands([cmd("hgetall", keys.run(p, rid)) for rid in reads
                                     if rid != own_run])
            got = iter(hashes)
            for rid in reads:
                h = run_fields(rid, {} if rid == own_run else next(got), jh)
                if not h:
                    continue
                run = Run.from_hash(h, rid)
                if rid == job.last_run_id and offset == 0 and run.state.value in INFLIGHT_STATES:
                    out.append(Attempt(run.id, run.attempt, run.state.value, run.worker,
                                       run.sched_ms, run.started_ms, None, None, run.error))
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
            (raws,) = yield Commands([cmd("lrange", keys.history(p, job_id), 0,
                                          offset + want - 1)])
            done = own + [Attempt.from_json(raw) for raw in raws]
            done.sort(key=lambda a: (a.ended_ms or 0, a.attempt), reverse=True)
            out += done[offset : offset + want]
        return out[:limit]

    @property
    def archive(self) -> Store | None:
        """The archive store, opened on first use (it connects on its first query)."""
        if self._archive is None and self.archive_url:
            from rsched.archive.store import open_store

            self._archive = open_store(self.archive_url)
        return self._archive

    def op_history(self, job_id: str, limit: int = 50, cursor: str | None = None,
                   *, max_scan: int | None = None) -> Op[RunsPage]:
        """A page of the job's attempts, newest first: the archive's and those whose events are
        still only in Redis's stream, each once (rsched.archive.history).  NotFound when neither
        knows the job and Redis has no such job."""
        from rsched.archive import history

        history.check_page(limit, cursor)
        scan = history.scan_recent(job_id, max_scan or history.DEFAULT_MAX_SCAN)
        try:
            key, top, count = next(scan)
            while True:
                (reply,) = yield Commands([cmd("xrevrange", key, max=top, min="-", count=count)])
                key, top, count = scan.send(reply)
        except StopIteration as done:
            recent, partial_ = done.value
        read = partial(history.runs_page, self.archive, job_id, recent, partial_, limit, cursor)
        page: RunsPage = (yield Blocking(read)) if self.archive is not None else read()
        if not page.items and not cursor:
            yield from self.op_get(job_id)
        return page

    def op_attempts(self, job_id: str, limit: int = 50, offset: int = 0
                    ) -> Op[list[Attempt] | list[RunAttempt]]:
        """Client.runs: the archive's full history when one is configured, else op_runs."""
        if not self.archive_url:
            return (yield from self.op_runs(job_id, limit, offset))
        from rsched.archive._paging import MAX_LIMIT

        out: list[RunAttempt] = []
        cursor = None
        while len(out) < offset + limit:
            page = yield from self.op_history(job_id, min(MAX_LIMIT, offset + limit - len(out)),
                                              cursor)
            out += page.items
            cursor = page.next_cursor
            if cursor is None:
                break
        return out[offset:offset + limit]

    def op_dead_letters(self, limit: int = 100) -> Op[list[Run]]:
        """Dead-lettered runs across all partitions, most recent first."""
        P = yield from self.op_partitions()
        res = yield Commands([cmd("zrevrange", keys.dead(p), 0, limit - 1, withscores=True)
                              for p in range(P)])
        entries = sorted(((score, rid.decode()) for r in res for rid, score in r),
                         reverse=True)[:limit]
        runs = yield from self.op_read_runs([rid for _, rid in entries])
        return [run for run in runs if run is not None]

    # --- control -----------------------------------------------------------------------------

    def op_control(self, name: str, job_id: str, extra: Sequence[Any] = ()) -> Op[Job]:
        p = partition_of(job_id)
        code, status = one((yield Scripts([(
            name, [keys.job(p, job_id), keys.due(p), keys.events(p)],
            [job_id, 0, self.settings.events_maxlen, *extra],
        )])))
        if code == -1:
            raise NotFound("job", job_id)
        if code == -2:
            raise Conflict("status", f"cannot {name} a job that is {status.decode()}")
        return (yield from self.op_get(job_id))

    def op_resume(self, job_id: str) -> Op[Job]:
        job = yield from self.op_get(job_id)
        if job.status is not JobStatus.PAUSED:
            if job.status is JobStatus.SCHEDULED:
                return job
            raise Conflict("status", f"cannot resume a job that is {job.status.value}")
        if job.cron:
            now = yield from self.op_now()
            nominal, score = next_occurrence(job.cron, job.tz, now, job.id, job.jitter_ms,
                                             job.priority)
        else:
            nominal = job.next_ms or 0
            score = due_score(nominal, job.priority)
        job = yield from self.op_control("resume", job_id, [nominal, score])
        yield from self.op_wake([job.partition])
        return job

    def op_trigger(self, job_id: str) -> Op[str]:
        p = partition_of(job_id)
        now = yield from self.op_now()
        rid = make_run_id(job_id, now)
        code, status = one((yield Scripts([(
            "trigger", [keys.job(p, job_id), keys.run(p, rid), keys.retry(p), keys.events(p)],
            [job_id, rid, now, 0, self.settings.events_maxlen],
        )])))
        if code == -1:
            raise NotFound("job", job_id)
        if code == -2:
            raise Conflict("status", f"cannot trigger a job that is {status.decode()}")
        yield from self.op_wake([p])
        return rid

    def op_replay(self, run_id: str) -> Op[Run]:
        if "@" not in run_id:
            raise ValidationError("runId", f"not a run id: {run_id!r}")
        job_id = job_of_run(run_id)
        p = partition_of(job_id)
        code, state = one((yield Scripts([(
            "replay",
            [keys.run(p, run_id), keys.job(p, job_id), keys.dead(p), keys.retry(p), keys.events(p)],
            [run_id, 0, self.settings.events_maxlen],
        )])))
        if code == -1:
            raise NotFound("dead letter", run_id)
        if code == -2:
            raise Conflict("status", "the job was cancelled; cancel is final")
        if code == 0 and state.decode() != "retry_wait":
            raise Conflict("runId", f"run is {state.decode()}, not dead-lettered")
        yield from self.op_wake([p])
        return (yield from self.op_get_run(run_id))


# --- the sync client ---------------------------------------------------------------------------


class Client(ClientBase):
    """Thread-safe (redis-py pools connections); create one per process and share it."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        redis: Redis | None = None,
        archive_url: str | None = None,
    ) -> None:
        super().__init__(settings or Settings.from_env(redis_url=redis_url), archive_url)
        self.r: Redis = fast_packing(redis or Redis.from_url(self.settings.redis_url))

    def run(self, op: Op[T]) -> T:
        """Execute an operation's Redis work on this client, one pipeline per step."""
        try:
            work = next(op)
            while True:
                work = op.send(self._execute(work))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _execute(self, work: Work) -> Any:
        if isinstance(work, Blocking):
            return work.fn()
        if isinstance(work, Scripts):
            return scripts.stream_many(self.r, work.calls)
        pipe = fill_pipeline(self.r.pipeline(transaction=False), work)
        return list(pipe.execute(raise_on_error=work.raise_on_error))

    @property
    def partitions(self) -> int:
        return self.run(self.op_partitions())

    def now_ms(self) -> int:
        return self.run(self.op_now())

    def schedule(self, type: str, payload: Any = None, **options: Any) -> Job:
        """Schedule one job; see JobSpec for the options. Raises on invalid input or conflict."""
        res = self.schedule_many([JobSpec(type=type, payload=payload, **options)])[0]
        if isinstance(res, Exception):
            raise res
        return res

    def schedule_many(self, specs: Sequence[JobSpec]) -> list[Job | RschedError]:
        """Schedule many jobs, one round trip per few hundred; each gets a Job or its own error."""
        return self.run(self.op_schedule_many(specs))

    def update(self, job_id: str, patch: JobPatch) -> Job:
        """Reschedule a job or change its payload, maxAttempts or priority."""
        return self.run(self.op_update(job_id, patch))

    def get(self, job_id: str) -> Job:
        return self.run(self.op_get(job_id))

    def get_run(self, run_id: str) -> Run:
        return self.run(self.op_get_run(run_id))

    def runs(self, job_id: str, limit: int = 50, offset: int = 0
             ) -> list[Attempt] | list[RunAttempt]:
        """The job's attempts, newest first, skipping ``offset``.  With an archive configured
        (``archive_url`` or RSCHED_ARCHIVE_URL): every attempt, archived or still in Redis, as
        RunAttempt; without: the in-flight run, then Redis's bounded history list."""
        return self.run(self.op_attempts(job_id, limit, offset))

    def history(self, job_id: str, limit: int = 50, cursor: str | None = None) -> RunsPage:
        """One page of the archive-merged history (see op_history); pass next_cursor on."""
        return self.run(self.op_history(job_id, limit, cursor))

    def dead_letters(self, limit: int = 100) -> list[Run]:
        """Dead-lettered runs across all partitions, most recent first."""
        return self.run(self.op_dead_letters(limit))

    def pause(self, job_id: str) -> Job:
        """Stop future occurrences; a run in progress finishes."""
        return self.run(self.op_control("pause", job_id))

    def cancel(self, job_id: str) -> Job:
        """Stop the job for good; a run in progress finishes, pending retries are abandoned."""
        return self.run(self.op_control("cancel", job_id))

    def resume(self, job_id: str) -> Job:
        """Resume a paused job; a cron job's next run is computed from now."""
        return self.run(self.op_resume(job_id))

    def trigger(self, job_id: str) -> str:
        """Run the job once now, outside its schedule; returns the new run id."""
        return self.run(self.op_trigger(job_id))

    def replay(self, run_id: str) -> Run:
        """Send a dead letter back for a new round of attempts (attempts counted from zero)."""
        return self.run(self.op_replay(run_id))

    def close(self) -> None:
        if self._archive is not None:
            self._archive.close()
        self.r.close()
