"""The asyncio client: the same operations as `rsched.Client`, executed on redis.asyncio.

The HTTP API runs on one event loop, where the sync client would block every request behind
each Redis round trip.  Single schedules arriving together are coalesced: while one schedule
pipeline is in flight, new requests queue up and go out as the next batch, so a burst of
single POST /jobs costs a few script calls instead of one round trip each, and a lone request
waits for nobody.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis

from rsched.client import ClientBase, JobHandle, resolve_settings
from rsched.core import defaults
from rsched.core.errors import RschedError
from rsched.core.http_target import HTTP_TYPE, target_of
from rsched.core.limits import Limit
from rsched.core.models import Attempt, BackfillOverlap, Job, Run
from rsched.core.settings import Settings
from rsched.core.spec import JobSpec
from rsched.rdb import ops
from rsched.rdb.connect import connect_async
from rsched.rdb.connections import fast_packing
from rsched.rdb.ops import Op
from rsched.service import jobs, limits, run_events, scheduling
from rsched.service.backfill import Backfill, op_backfill
from rsched.service.history import RunAttempt, RunsPage, op_history
from rsched.service.inputs import backfill_range
from rsched.service.patch import JobPatch
from rsched.service.shapes import event_json

T = TypeVar("T")

COALESCE_MAX = 1000  # single schedules sent in one batch at most


class AsyncScheduledJob(JobHandle):
    """AsyncClient.schedule's answer: the Job, and ``await result(timeout)`` for its run."""

    __slots__ = ()

    async def result(self, timeout: float | None = None) -> Any:
        """ScheduledJob.result, awaited."""
        return await self.client.result(self, timeout)


class AsyncClient(ClientBase):
    """One per event loop: `Client`'s constructor and operations, as coroutines.  Single
    schedules of concurrent callers go to Redis in one batch (schedule_spec); without a URL or
    ``settings``, its Redis is found as `Client`'s is."""

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None,
                 redis: Redis | None = None, archive_url: str | None = None) -> None:
        settings, dev_archive = resolve_settings(redis_url, settings)
        super().__init__(settings, archive_url, dev_archive)
        self.r: Redis = (fast_packing(redis) if redis is not None
                         else connect_async(settings.redis_url, wait=settings.wait_replicas,
                                            wait_timeout_ms=settings.wait_timeout_ms))
        self._queued: list[tuple[JobSpec, asyncio.Future[tuple[Job, bool]]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def run(self, op: Op[T]) -> T:
        """Execute an operation's Redis work on this client, one pipeline per step."""
        return await ops.arun(self.r, op)

    # --- scheduling --------------------------------------------------------------------------

    async def schedule(self, type: str, payload: Any = None, **options: Any
                       ) -> AsyncScheduledJob:
        """Schedule one job; see JobSpec for the options. Raises on invalid input or conflict.
        The Job it answers also waits for a one-off job's result: ``await .result(timeout)``."""
        job, _ = await self.schedule_spec(JobSpec(type=type, payload=payload, **options))
        return AsyncScheduledJob.of(job, self)

    async def schedule_http(self, url: str, payload: Any = None, *, method: str | None = None,
                      headers: dict[str, str] | None = None, body: Any = None,
                      timeout_s: float | None = None, **options: Any) -> Job:
        """Schedule an HTTP target job (docs/http-targets.md): a worker started with --http
        calls ``url`` at each run, signed, with ``body`` (default ``payload``) as JSON; see
        JobSpec for the other options (run_at, cron, max_attempts, ...)."""
        return await self.schedule(HTTP_TYPE, payload, target=target_of(url, method, headers, body,
                                                                   timeout_s), **options)

    async def schedule_spec(self, spec: JobSpec) -> tuple[Job, bool]:
        """Schedule one job, batched with concurrent callers; (job, created by this call)."""
        fut: asyncio.Future[tuple[Job, bool]] = asyncio.get_running_loop().create_future()
        self._queued.append((spec, fut))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_queued())
        return await fut

    async def _send_queued(self) -> None:
        try:
            while self._queued:
                batch = self._queued[:COALESCE_MAX]
                del self._queued[:COALESCE_MAX]
                results: list[Any]
                try:
                    results = await self.run(scheduling.op_schedule_created(
                        self, [s for s, _ in batch]))
                except Exception as e:  # noqa: BLE001 - every waiter gets the batch's error
                    results = [e] * len(batch)
                for (_, fut), res in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if isinstance(res, BaseException):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)
        finally:
            self._sender = None

    async def schedule_many(
        self, specs: Sequence[JobSpec]
    ) -> list[tuple[Job, bool] | RschedError]:
        """Schedule a batch; each spec gets (job, created) or its own error, in order."""
        return await self.run(scheduling.op_schedule_created(self, specs))

    async def update(self, job_id: str, patch: JobPatch, *, if_match: int | None = None) -> Job:
        """Reschedule a job or change its payload, maxAttempts, priority or lifecycle limits;
        with ``if_match``, only while the job is at that version (else VersionMismatch)."""
        return await self.run(scheduling.op_update(self, job_id, patch, if_match))

    # --- reading -----------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """The job; NotFound when there is none."""
        return await self.run(jobs.op_get(job_id))

    async def get_run(self, run_id: str) -> Run:
        """One run (an occurrence, ``<job id>@<scheduled ms>``); NotFound when there is none."""
        return await self.run(jobs.op_get_run(run_id))

    async def wait(self, run_id: str, timeout: float | None = None) -> Run:
        """Client.wait, awaited."""
        run = await self.run(run_events.op_wait_run(run_id,
                                                    math.inf if timeout is None else timeout))
        return run_events.check_ended(run, run_id, timeout)

    async def result(self, job: Job | str, timeout: float | None = None) -> Any:
        """Client.result, awaited."""
        found = await self.get(job) if isinstance(job, str) else job
        run_id = run_events.first_run(found)
        run = await self.run(run_events.op_wait_run(
            run_id, math.inf if timeout is None else timeout))
        return run_events.result_of(run_events.check_ended(run, run_id, timeout))

    async def events(self, job_id: str, after: str | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
        """Client.events, as an async iterator."""
        for read in run_events.op_job_events(job_id, run_events.check_event_id(after)):
            for event_id, row in await self.run(read):
                for ev in run_events.with_start(row):
                    yield event_json(event_id if ev is row else None, ev)

    async def runs(self, job_id: str, limit: int = defaults.PAGE_LIMIT, offset: int = 0
                   ) -> list[Attempt] | list[RunAttempt]:
        """The job's attempts, newest first, skipping ``offset`` (archive-merged when
        an archive is configured, as Client.runs)."""
        return await self.run(self.runs_source.op_attempts(job_id, limit, offset))

    async def history(self, job_id: str, limit: int = defaults.PAGE_LIMIT,
                      cursor: str | None = None) -> RunsPage:
        """One page of the archive-merged history; pass next_cursor on."""
        return await self.run(op_history(self, job_id, limit, cursor))

    async def now_ms(self) -> int:
        """Redis's clock, in epoch ms: the clock every due time is judged by."""
        return await self.run(self.op_now())

    async def partitions(self) -> int:
        """The partition count stored in Redis at first start."""
        return await self.run(self.op_partitions())

    # --- control -----------------------------------------------------------------------------

    async def pause(self, job_id: str, *, if_match: int | None = None,
                note: str | None = None, by: str = "python") -> Job:
        """Stop future occurrences (a run in progress finishes); ``note``, ``by`` go in the job."""
        return await self.run(jobs.op_pause(self, job_id, if_match, by, note))

    async def cancel(self, job_id: str, *, if_match: int | None = None) -> Job:
        """Stop the job for good; a run in progress finishes, pending retries are abandoned."""
        return await self.run(jobs.op_cancel(self, job_id, if_match))

    async def resume(self, job_id: str, *, if_match: int | None = None,
                note: str | None = None, by: str = "python") -> Job:
        """Resume a paused job (a cron job's next run from now); ``note``, ``by`` go in the job."""
        return await self.run(jobs.op_resume(self, job_id, if_match, by, note))

    async def trigger(self, job_id: str) -> str:
        """Run the job once now, outside its schedule; returns the new run id."""
        return await self.run(jobs.op_trigger(self, job_id))

    async def backfill(self, job_id: str, start: Any, end: Any, *, dry_run: bool = False,
                       overlap: BackfillOverlap | str = defaults.BACKFILL_OVERLAP) -> Backfill:
        """Run each occurrence of a recurring job's schedule in [start, end) once, under
        ``overlap`` (see Client.backfill); with ``dry_run``, write nothing and answer what
        each would become."""
        return await self.run(op_backfill(self, job_id, *backfill_range(start, end), dry_run,
                                          overlap))

    async def replay(self, run_id: str) -> Run:
        """Send a dead letter back for a new round of attempts (attempts counted from zero)."""
        return await self.run(jobs.op_replay(self, run_id))

    async def set_limit(self, name: str, *, concurrency: int | None = None,
                        rate: tuple[int, float] | None = None) -> Limit:
        """Define (or replace) the limit ``name``; see Client.set_limit."""
        return await self.run(limits.op_set_limit(
            self, limits.limit_from_args(name, concurrency, rate)))

    async def set_queue_limit(self, queue: str, *, concurrency: int | None = None,
                              rate: tuple[int, float] | None = None) -> Limit:
        """Cap the whole queue ``queue``; see Client.set_queue_limit."""
        return await self.run(limits.op_set_queue_limit(
            self, limits.queue_limit_from_args(queue, concurrency, rate)))

    async def get_queue_limit(self, queue: str) -> limits.LimitView:
        """The queue's limit, its runs in flight and waiting."""
        return await self.run(limits.op_get_queue_limit(self, queue))

    async def delete_queue_limit(self, queue: str) -> None:
        """Delete the queue's limit; its waiting runs start."""
        await self.run(limits.op_delete_queue_limit(self, queue))

    async def get_limit(self, name: str) -> limits.LimitView:
        """The definition ``name``, and for a key's own its in-flight and waiting counts."""
        return await self.run(limits.op_get_limit(self, name))

    async def delete_limit(self, name: str) -> None:
        """Delete a definition; its keys' waiting runs start (a key without one is unlimited)."""
        await self.run(limits.op_delete_limit(self, name))

    async def list_limits(self) -> list[Limit]:
        """Every definition, by name."""
        return await self.run(limits.op_all_limits())

    async def close(self) -> None:
        """Wait for queued schedule calls, then close the connections (and the archive's)."""
        if self._sender is not None:
            await asyncio.wait([self._sender], timeout=5)
        if self._archive is not None:
            await asyncio.to_thread(self._archive.close)
        await self.r.aclose()


__all__ = ["AsyncClient", "JobPatch"]
