"""The Python client: schedule, inspect and control jobs (the service layer the CLI and API use)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Iterable, Sequence

from redis import Redis

from . import keys, scripts
from .errors import Conflict, NotFound, RschedError, ValidationError
from .ids import new_job_id, run_id as make_run_id
from .models import Attempt, Job, JobStatus, Run, job_of_run, partition_of
from .redis_setup import ensure_partitions
from .settings import Settings
from .spec import JobSpec, Prepared, next_occurrence, prepare

DEFAULT_PARTITIONS = 16
SCHEDULE_CHUNK = 250  # jobs per script call: bounded argument lists, short Redis pauses


class Client:
    """Thread-safe (redis-py pools connections); create one per process and share it."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        redis: Redis | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env(redis_url=redis_url)
        self.r: Redis = redis or Redis.from_url(self.settings.redis_url)
        self._partitions: int | None = None
        self._offset_ms = 0
        self._offset_at = 0.0

    # --- plumbing ----------------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        if self._partitions is None:
            wanted = self.settings.partitions or DEFAULT_PARTITIONS
            self._partitions = ensure_partitions(self.r, wanted, bool(self.settings.partitions))
        return self._partitions

    def now_ms(self) -> int:
        """Redis's clock, estimated locally from an offset refreshed every 30 s."""
        mono = time.monotonic()
        if mono - self._offset_at > 30 or not self._offset_at:
            before = time.time()
            sec, usec = self.r.time()
            after = time.time()
            self._offset_ms = int(sec * 1000 + usec // 1000 - (before + after) * 500)
            self._offset_at = mono
        return int(time.time() * 1000) + self._offset_ms

    def _wake(self, partitions: Iterable[int]) -> None:
        ps = set(partitions)
        if ps:
            p = self.r.pipeline(transaction=False)
            for n in ps:
                p.publish(keys.wake_channel(), n)
            p.execute()

    # --- scheduling --------------------------------------------------------------------------

    def schedule(self, type: str, payload: Any = None, **options: Any) -> Job:
        """Schedule one job; see JobSpec for the options. Raises on invalid input or conflict."""
        res = self.schedule_many([JobSpec(type=type, payload=payload, **options)])[0]
        if isinstance(res, Exception):
            raise res
        return res

    def schedule_many(self, specs: Sequence[JobSpec]) -> list[Job | RschedError]:
        """Schedule many jobs in one round trip per few hundred; each gets a Job or its own error."""
        out: list[Job | RschedError | None] = [None] * len(specs)
        now = self.now_ms()
        P = self.partitions
        by_part: dict[int, list[tuple[int, Prepared]]] = defaultdict(list)
        for i, spec in enumerate(specs):
            try:
                job_id = new_job_id(P, spec.idempotency_key)
                by_part[partition_of(job_id)].append(
                    (i, prepare(spec, job_id, now, self.settings.max_payload_bytes))
                )
            except RschedError as e:
                out[i] = e
        calls: list[scripts.Call] = []
        layout: list[tuple[int, list[tuple[int, Prepared]]]] = []
        for p, items in by_part.items():
            for c in range(0, len(items), SCHEDULE_CHUNK):
                chunk = items[c : c + SCHEDULE_CHUNK]
                calls.append(self._schedule_call(p, [prep for _, prep in chunk]))
                layout.append((p, chunk))
        results = scripts.call_many(self.r, calls)
        wake: set[int] = set()
        existing: list[tuple[int, str]] = []
        for (p, chunk), res in zip(layout, results):
            if isinstance(res, Exception):
                raise res
            if res[0] == 1:
                wake.add(p)
            created_ms = int(res[1])
            for (i, prep), code in zip(chunk, res[2:]):
                if code == 0:
                    f = dict(prep.fields, created_ms=created_ms, updated_ms=created_ms)
                    out[i] = Job.from_hash(f)
                elif code == 1:
                    existing.append((i, prep.fields["id"]))
                else:
                    out[i] = Conflict(
                        "idempotencyKey", "already used for a job with a different body"
                    )
        if existing:
            pipe = self.r.pipeline(transaction=False)
            for _, job_id in existing:
                pipe.hgetall(keys.job(partition_of(job_id), job_id))
            for (i, _), h in zip(existing, pipe.execute()):
                out[i] = Job.from_hash(h)
        self._wake(wake)
        return out  # type: ignore[return-value]

    def _schedule_call(self, p: int, preps: list[Prepared]) -> scripts.Call:
        ks = [keys.due(p), keys.events(p), keys.queues(p)]
        args: list[Any] = [0, self.settings.events_maxlen, len(preps)]
        for prep in preps:
            f = prep.fields
            ks.append(keys.job(p, f["id"]))
            paused = f["status"] == JobStatus.PAUSED.value
            args += [f["id"], f["queue"], f["type"], prep.body_hash, "" if paused else prep.score,
                     len(f)]
            for k, v in f.items():
                args += [k, v]
        return ("schedule", ks, args)

    # --- reading -----------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        h = self.r.hgetall(keys.job(partition_of(job_id), job_id))
        if not h:
            raise NotFound("job", job_id)
        return Job.from_hash(h)

    def get_run(self, run_id: str) -> Run:
        job_id = job_of_run(run_id)
        h = self.r.hgetall(keys.run(partition_of(job_id), run_id))
        if not h:
            raise NotFound("run", run_id)
        return Run.from_hash(h)

    def runs(self, job_id: str, limit: int = 50) -> list[Attempt]:
        """The job's in-flight run (if any) then its most recent finished attempts, newest first."""
        job = self.get(job_id)
        p = job.partition
        out: list[Attempt] = []
        if job.last_run_id:
            h = self.r.hgetall(keys.run(p, job.last_run_id))
            if h:
                run = Run.from_hash(h)
                if run.state.value in ("dispatched", "running", "retry_wait"):
                    out.append(Attempt(run.id, run.attempt, run.state.value, run.worker,
                                       run.sched_ms, run.started_ms, None, None, run.error))
        for raw in self.r.lrange(keys.history(p, job_id), 0, max(limit - len(out), 0) - 1):
            out.append(Attempt.from_json(raw))
        return out[:limit]

    def dead_letters(self, limit: int = 100) -> list[Run]:
        """Dead-lettered runs across all partitions, most recent first."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.zrevrange(keys.dead(p), 0, limit - 1, withscores=True)
        entries = sorted(
            ((score, rid.decode()) for res in pipe.execute() for rid, score in res), reverse=True
        )[:limit]
        pipe = self.r.pipeline(transaction=False)
        for _, rid in entries:
            pipe.hgetall(keys.run(partition_of(job_of_run(rid)), rid))
        return [Run.from_hash(h) for h in pipe.execute() if h]

    # --- control -----------------------------------------------------------------------------

    def _control(self, name: str, job_id: str, extra: Sequence[Any] = ()) -> Job:
        p = partition_of(job_id)
        code, status = scripts.call(
            self.r, name, [keys.job(p, job_id), keys.due(p), keys.events(p)],
            [job_id, 0, self.settings.events_maxlen, *extra],
        )
        if code == -1:
            raise NotFound("job", job_id)
        if code == -2:
            raise Conflict("status", f"cannot {name} a job that is {status.decode()}")
        return self.get(job_id)

    def pause(self, job_id: str) -> Job:
        """Stop future occurrences; a run in progress finishes."""
        return self._control("pause", job_id)

    def cancel(self, job_id: str) -> Job:
        """Stop the job for good; a run in progress finishes, pending retries are abandoned."""
        return self._control("cancel", job_id)

    def resume(self, job_id: str) -> Job:
        """Resume a paused job; a cron job's next run is computed from now."""
        job = self.get(job_id)
        if job.status is not JobStatus.PAUSED:
            if job.status is JobStatus.SCHEDULED:
                return job
            raise Conflict("status", f"cannot resume a job that is {job.status.value}")
        if job.cron:
            nominal, score = next_occurrence(job.cron, job.tz, self.now_ms(), job.id, job.jitter_ms)
        else:
            nominal = score = job.next_ms or 0
        job = self._control("resume", job_id, [nominal, score])
        self._wake([job.partition])
        return job

    def trigger(self, job_id: str) -> str:
        """Run the job once now, outside its schedule; returns the new run id."""
        p = partition_of(job_id)
        now = self.now_ms()
        rid = make_run_id(job_id, now)
        code, status = scripts.call(
            self.r, "trigger",
            [keys.job(p, job_id), keys.run(p, rid), keys.retry(p), keys.events(p)],
            [job_id, rid, now, 0, self.settings.events_maxlen],
        )
        if code == -1:
            raise NotFound("job", job_id)
        if code == -2:
            raise Conflict("status", f"cannot trigger a job that is {status.decode()}")
        self._wake([p])
        return rid

    def replay(self, run_id: str) -> Run:
        """Send a dead letter back for a new round of attempts (attempts counted from zero)."""
        if "@" not in run_id:
            raise ValidationError("runId", f"not a run id: {run_id!r}")
        job_id = job_of_run(run_id)
        p = partition_of(job_id)
        code, state = scripts.call(
            self.r, "replay",
            [keys.run(p, run_id), keys.job(p, job_id), keys.dead(p), keys.retry(p), keys.events(p)],
            [run_id, 0, self.settings.events_maxlen],
        )
        if code == -1:
            raise NotFound("dead letter", run_id)
        if code == -2:
            raise Conflict("status", "the job was cancelled; cancel is final")
        if code == 0 and state.decode() != "retry_wait":
            raise Conflict("runId", f"run is {state.decode()}, not dead-lettered")
        self._wake([p])
        return self.get_run(run_id)

    def close(self) -> None:
        self.r.close()
