"""The Python clients' shared part, and the sync `Client`.

The operations are in rsched.service, each written once as an Op (rsched.rdb.ops): a
generator yielding the Redis work it needs.  A client is a driver that executes that work,
plus one thin method per operation; rsched.aclient.AsyncClient is the asyncio one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Self, TypeVar

from redis import Redis

from rsched.core import defaults
from rsched.core.errors import RschedError
from rsched.core.http_target import HTTP_TYPE, target_of
from rsched.core.limits import Limit
from rsched.core.models import Attempt, BackfillOverlap, Job, Run
from rsched.core.settings import Settings
from rsched.core.spec import JobSpec
from rsched.rdb import ops
from rsched.rdb.connect import connect
from rsched.rdb.connections import fast_packing
from rsched.rdb.durable import wait_of
from rsched.rdb.ops import Op
from rsched.rdb.setup import check_topology
from rsched.service import jobs, limits, run_events, scheduling
from rsched.service.backfill import Backfill, op_backfill
from rsched.service.context import Service
from rsched.service.history import RunAttempt, RunsPage, history_of, op_history
from rsched.service.inputs import backfill_range
from rsched.service.patch import UNSET, JobPatch
from rsched.service.shapes import event_json

T = TypeVar("T")


class JobHandle(Job):
    """A Job as scheduled, with the client that scheduled it: what Client.schedule returns.
    It is the Job (every field, equal to the same job read back by get), and waits for its run."""

    __slots__ = ("client",)
    client: Any  # the Client or AsyncClient that scheduled it

    @classmethod
    def of(cls, job: Job, client: Any) -> Self:
        """The job, with ``client`` to wait through."""
        handle = cls(**{f.name: getattr(job, f.name) for f in fields(Job)})
        handle.client = client
        return handle

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Job):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(Job))

    __hash__ = None  # type: ignore[assignment]  # mutable, like Job


class ScheduledJob(JobHandle):
    """Client.schedule's answer: the Job, and ``result(timeout)`` waiting for its run."""

    __slots__ = ()

    def result(self, timeout: float | None = None) -> Any:
        """The one-off job's result once its run has ended (Client.result): TimeoutError after
        ``timeout`` seconds (None: none), RunFailed when it ended without succeeding."""
        return self.client.result(self, timeout)


def dev_urls(data_dir: Path = Path(defaults.DEV_DATA_DIR)) -> tuple[str, str | None] | None:
    """(Redis URL, archive URL or None) of the `rsched dev` running with ``data_dir``, from the
    files it keeps there while it runs (mode 0600: the Redis URL holds its password); None when
    no rsched dev runs there."""
    found = []
    for name in (defaults.DEV_URL_FILE, defaults.DEV_ARCHIVE_FILE):
        try:
            found.append((data_dir / name).read_text().strip() or None)
        except OSError:
            found.append(None)
    redis_url, archive_url = found
    return (redis_url, archive_url) if redis_url else None


def resolve_settings(redis_url: str | None = None, settings: Settings | None = None
                     ) -> tuple[Settings, str | None]:
    """The settings a client without any uses, and the archive that comes with its Redis.

    The Redis is ``redis_url``, else RSCHED_REDIS_URL, else that of the `rsched dev` running in
    the working directory, else Settings' default.  The archive returned is the dev's, when the
    Redis is the dev's: an explicit archive URL or RSCHED_ARCHIVE_URL still comes first."""
    dev = dev_urls()
    if settings is None:
        if redis_url is None and not os.environ.get("RSCHED_REDIS_URL") and dev is not None:
            redis_url = dev[0]
        settings = Settings.from_env(redis_url=redis_url)
    return settings, dev[1] if dev is not None and dev[0] == settings.redis_url else None


class ClientBase(Service):
    """What both clients share: the service's state, the history source and the Op forms of
    operations callers batch or drive themselves."""

    def __init__(self, settings: Settings, archive_url: str | None = None,
                 fallback_archive_url: str | None = None) -> None:
        super().__init__(settings, archive_url)
        self.archive_url = self.archive_url or fallback_archive_url
        self.runs_source = history_of(self)
        """Where runs() and GET /jobs/{id}/runs read: the archive when configured, else Redis."""

    @property
    def wait_replicas(self) -> int:
        """Replicas each client-facing write waits for (RSCHED_WAIT_REPLICAS, resolved)."""
        wait = wait_of(self.r)  # type: ignore[attr-defined]  # set by each client
        return wait.replicas if wait is not None else 0

    def op_schedule_many(self, specs: Sequence[JobSpec]) -> Op[list[Job | RschedError]]:
        """schedule_many as an Op, for callers that batch it with other work."""
        return scheduling.op_schedule_many(self, specs)

    def op_schedule_created(
        self, specs: Sequence[JobSpec]
    ) -> Op[list[tuple[Job, bool] | RschedError]]:
        """Like op_schedule_many, with each job paired with True if this call created it."""
        return scheduling.op_schedule_created(self, specs)

    def op_read_runs(self, run_ids: Sequence[str]) -> Op[list[Run | None]]:
        """The runs of ``run_ids`` (None for one that does not exist), as an Op."""
        return jobs.op_read_runs(run_ids)


class Client(ClientBase):
    """Thread-safe (redis-py pools connections); create one per process and share it.

    Its Redis: ``redis_url``, else ``settings``, else RSCHED_REDIS_URL, else that of the
    `rsched dev` running in the working directory (with its archive), else Settings' default."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        redis: Redis | None = None,
        archive_url: str | None = None,
    ) -> None:
        settings, dev_archive = resolve_settings(redis_url, settings)
        super().__init__(settings, archive_url, dev_archive)
        self.r: Redis = (fast_packing(redis) if redis is not None
                         else connect(self.settings.redis_url, wait=self.settings.wait_replicas,
                                      wait_timeout_ms=self.settings.wait_timeout_ms))
        self.streams_calls = ops.streams(self.r, durable=True)  # scheduling's writes are durable

    def run(self, op: Op[T]) -> T:
        """Execute an operation's Redis work on this client, one pipeline per step."""
        return ops.run(self.r, op)

    def check(self, replicas: bool = True) -> None:
        """Raise UnsafeRedis when this client cannot work as asked: a plain URL at a cluster
        node or a replica, or (``replicas``) writes waiting for more replicas than a master
        has.  One round trip; every process and CLI command runs it before anything else."""
        check_topology(self.r, replicas)

    @property
    def partitions(self) -> int:
        """The partition count stored in Redis at first start."""
        return self.run(self.op_partitions())

    def now_ms(self) -> int:
        """Redis's clock, in epoch ms: the clock every due time is judged by."""
        return self.run(self.op_now())

    def schedule(self, type: str, payload: Any = None, **options: Any) -> ScheduledJob:
        """Schedule one job; see JobSpec for the options. Raises on invalid input or conflict.
        The Job it answers also waits for a one-off job's result: ``.result(timeout)``."""
        res = self.schedule_many([JobSpec(type=type, payload=payload, **options)])[0]
        if isinstance(res, Exception):
            raise res
        return ScheduledJob.of(res, self)

    def schedule_http(self, url: str, payload: Any = None, *, method: str | None = None,
                      headers: dict[str, str] | None = None, body: Any = None,
                      timeout_s: float | None = None, **options: Any) -> Job:
        """Schedule an HTTP target job (docs/http-targets.md): a worker started with --http
        calls ``url`` at each run, signed, with ``body`` (default ``payload``) as JSON; see
        JobSpec for the other options (run_at, cron, max_attempts, ...)."""
        return self.schedule(HTTP_TYPE, payload, target=target_of(url, method, headers, body,
                                                                   timeout_s), **options)

    def schedule_many(self, specs: Sequence[JobSpec]) -> list[Job | RschedError]:
        """Schedule many jobs, one round trip per few hundred; each gets a Job or its own error."""
        return self.run(scheduling.op_schedule_many(self, specs))

    def update(self, job_id: str, patch: JobPatch, *, if_match: int | None = None) -> Job:
        """Reschedule a job or change its payload, maxAttempts, priority or lifecycle limits;
        with ``if_match``, only while the job is at that version (else VersionMismatch)."""
        return self.run(scheduling.op_update(self, job_id, patch, if_match))

    def get(self, job_id: str) -> Job:
        """The job; NotFound when there is none."""
        return self.run(jobs.op_get(job_id))

    def get_run(self, run_id: str) -> Run:
        """One run (an occurrence, ``<job id>@<scheduled ms>``); NotFound when there is none."""
        return self.run(jobs.op_get_run(run_id))

    def wait(self, run_id: str, timeout: float | None = None) -> Run:
        """The run once it has ended (succeeded, dead, cancelled, skipped, abandoned), read as
        its events come, not by polling; TimeoutError after ``timeout`` seconds (None: none)."""
        run = self.run(run_events.op_wait_run(run_id, math.inf if timeout is None else timeout))
        return run_events.check_ended(run, run_id, timeout)

    def result(self, job: Job | str, timeout: float | None = None) -> Any:
        """A one-off job's result: its run waited for (see wait); RunFailed when it ended
        without succeeding."""
        run_id = run_events.first_run(self.get(job) if isinstance(job, str) else job)
        run = self.run(run_events.op_wait_run(run_id, math.inf if timeout is None else timeout))
        return run_events.result_of(run_events.check_ended(run, run_id, timeout))

    def events(self, job_id: str, after: str | None = None) -> Iterator[dict[str, Any]]:
        """The job's events as they happen (GET /jobs/{id}/events's shape), for ever: from now,
        or after the event id ``after``."""
        for read in run_events.op_job_events(job_id, run_events.check_event_id(after)):
            for event_id, row in self.run(read):
                for ev in run_events.with_start(row):
                    yield event_json(event_id if ev is row else None, ev)

    def runs(self, job_id: str, limit: int = defaults.PAGE_LIMIT, offset: int = 0
             ) -> list[Attempt] | list[RunAttempt]:
        """The job's attempts, newest first, skipping ``offset``.  With an archive configured
        (``archive_url`` or RSCHED_ARCHIVE_URL): every attempt, archived or still in Redis, as
        RunAttempt; without: the in-flight run, then Redis's bounded history list."""
        return self.run(self.runs_source.op_attempts(job_id, limit, offset))

    def history(self, job_id: str, limit: int = defaults.PAGE_LIMIT,
                cursor: str | None = None) -> RunsPage:
        """One page of the archive-merged history (see op_history); pass next_cursor on."""
        return self.run(op_history(self, job_id, limit, cursor))

    def dead_letters(self, limit: int = 100) -> list[Run]:
        """Dead-lettered runs across all partitions, most recent first."""
        return self.run(jobs.op_dead_letters(self, limit))

    def pause(self, job_id: str, *, if_match: int | None = None,
          note: str | None = None, by: str = "python") -> Job:
        """Stop future occurrences (a run in progress finishes); ``note``, ``by`` go in the job."""
        return self.run(jobs.op_pause(self, job_id, if_match, by, note))

    def cancel(self, job_id: str, *, if_match: int | None = None) -> Job:
        """Stop the job for good; a run in progress finishes, pending retries are abandoned."""
        return self.run(jobs.op_cancel(self, job_id, if_match))

    def resume(self, job_id: str, *, if_match: int | None = None,
          note: str | None = None, by: str = "python") -> Job:
        """Resume a paused job (a cron job's next run from now); ``note``, ``by`` go in the job."""
        return self.run(jobs.op_resume(self, job_id, if_match, by, note))

    def trigger(self, job_id: str) -> str:
        """Run the job once now, outside its schedule; returns the new run id."""
        return self.run(jobs.op_trigger(self, job_id))

    def backfill(self, job_id: str, start: Any, end: Any, *, dry_run: bool = False,
                 overlap: BackfillOverlap | str = defaults.BACKFILL_OVERLAP) -> Backfill:
        """Run each occurrence of a recurring job's schedule in [start, end) that has no run
        yet, once, with its nominal time (times: epoch ms, aware datetimes or ISO-8601), under
        ``overlap``: bufferAll (default) one after another, never beside a run of the job, or
        one of the job's policies; with ``dry_run``, write nothing and answer what each would
        become now.  Errors name the API's fields, from, to and overlap."""
        return self.run(op_backfill(self, job_id, *backfill_range(start, end), dry_run,
                                    overlap))

    def replay(self, run_id: str) -> Run:
        """Send a dead letter back for a new round of attempts (attempts counted from zero)."""
        return self.run(jobs.op_replay(self, run_id))

    def set_limit(self, name: str, *, concurrency: int | None = None,
                  rate: tuple[int, float] | None = None) -> Limit:
        """Define (or replace) the limit ``name`` (a key, or a family ending in '*'): at most
        ``concurrency`` runs at once, at most ``rate`` = (limit, period seconds) starts in any
        such window.  It applies at once, across every dispatcher and worker."""
        return self.run(limits.op_set_limit(self, limits.limit_from_args(name, concurrency, rate)))

    def set_queue_limit(self, queue: str, *, concurrency: int | None = None,
                        rate: tuple[int, float] | None = None) -> Limit:
        """Cap the whole queue ``queue`` (every job of it, with or without a limit key), across
        every worker and dispatcher: at most ``concurrency`` of its runs at once, at most
        ``rate`` = (limit, period seconds) starts in any such window."""
        return self.run(limits.op_set_queue_limit(
            self, limits.queue_limit_from_args(queue, concurrency, rate)))

    def get_queue_limit(self, queue: str) -> limits.LimitView:
        """The queue's limit (its ``name`` is the queue), its runs in flight and waiting."""
        return self.run(limits.op_get_queue_limit(self, queue))

    def delete_queue_limit(self, queue: str) -> None:
        """Delete the queue's limit; its waiting runs start."""
        self.run(limits.op_delete_queue_limit(self, queue))

    def get_limit(self, name: str) -> limits.LimitView:
        """The definition ``name``, and for a key's own its in-flight and waiting counts."""
        return self.run(limits.op_get_limit(self, name))

    def delete_limit(self, name: str) -> None:
        """Delete a definition; its keys' waiting runs start (a key without one is unlimited)."""
        self.run(limits.op_delete_limit(self, name))

    def list_limits(self) -> list[Limit]:
        """Every definition, by name."""
        return self.run(limits.op_all_limits())

    def close(self) -> None:
        """Close the connections (and the archive's); a ``with`` block does it."""
        if self._archive is not None:
            self._archive.close()
        self.r.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["UNSET", "Client", "ClientBase", "JobPatch", "dev_urls", "resolve_settings"]
