"""The worker process: its parts put together, its run loop, drain and close.

Hot path per batch, not per job: one XREADGROUP for every stream (intake), handlers start at
once and run concurrently (runner), and outcomes are flushed every few milliseconds with one
complete script per partition, which also records the start of runs that finished quickly
(reporter); while the table is (nearly) full, the next read goes in a report's round trip.
Only runs still going after ``start_after_ms`` get a start script of their own
(batched), which takes their fencing token before any heartbeat; a run's start thus costs
nothing extra on the hot path, and a long run is recorded as running well within the
visibility timeout.  Heartbeats (membership) keep the stream entries of long runs fresh so
XAUTOCLAIM in other workers only takes runs whose worker really stopped; the process heartbeat
(liveness, once a second for the whole process) lets other workers take over all the runs of a
worker silent for dead-after at once.  Reclaimed runs are started (and fenced) before their
handler runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.handlers import App
from rsched.core.ids import process_id
from rsched.core.settings import Settings
from rsched.engine import aio
from rsched.engine._calls import CallMany
from rsched.engine.worker._link import Link
from rsched.engine.worker.handback import Handback
from rsched.engine.worker.inflight import Outcome, Runs
from rsched.engine.worker.intake import Intake
from rsched.engine.worker.liveness import Liveness
from rsched.engine.worker.loops import FLUSHES_IN_FLIGHT, Every, Flusher, ProgressSender
from rsched.engine.worker.membership import Membership
from rsched.engine.worker.permits import Permits
from rsched.engine.worker.read_along import ReadAlong
from rsched.engine.worker.reporter import Reporter
from rsched.engine.worker.runner import Runner

if TYPE_CHECKING:
    from rsched.engine.worker.http_target import HttpTargets
from rsched.obs.metrics import RunMetrics
from rsched.rdb import keys, scripts
from rsched.rdb.cluster import same_slot_groups
from rsched.rdb.connect import connect_async
from rsched.rdb.redis_api import ResponseError
from rsched.rdb.setup import (
    Outage,
    acheck_redis,
    aensure_partitions,
    is_unavailable,
    wait_for_redis,
)

log = logging.getLogger("rsched.worker")

FLUSH_WAIT_S = 5  # at shutdown, how long the last reports may take
PRUNE_EVERY_S = 300
ADOPT_BUSY_S = 0.005  # runs set aside for us wait, and no slot is free: look again this soon


class Worker:
    """Reads runs from the queue streams, runs their handlers and records them in Redis."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        *,
        queues: Sequence[str] = (defaults.QUEUE,),
        concurrency: int = defaults.CONCURRENCY,
        worker_id: str | None = None,
        visibility_ms: int = defaults.VISIBILITY_MS,
        heartbeat_ms: int = defaults.HEARTBEAT_MS,
        grace_s: float = defaults.GRACE_S,
        threads: int | None = None,
        flush_ms: float = defaults.FLUSH_MS,
        start_after_ms: int = defaults.START_AFTER_MS,
        handler_wait_s: float = defaults.HANDLER_WAIT_S,
        dead_after_ms: int = defaults.DEAD_AFTER_MS,
        call_many: CallMany | None = None,
        http: bool = False,
    ) -> None:
        if heartbeat_ms * 2 > visibility_ms:
            raise ValidationError(
                "heartbeatMs", f"must be at most half of visibilityMs ({visibility_ms}), "
                "or live runs get reclaimed between two heartbeats")
        if concurrency < 1:
            raise ValidationError("concurrency", "must be at least 1")
        if not queues:  # nothing to read: the intake would divide by zero
            raise ValidationError("queues", "give at least one queue")
        if start_after_ms < 0:
            # Heartbeats record every pending start first, so a start lands within
            # heartbeat_ms, well before the entry can look idle to other workers.
            raise ValidationError("startAfterMs", "must be 0 or more")
        if dead_after_ms < defaults.MIN_DEAD_AFTER_MS:
            least = defaults.MIN_DEAD_AFTER_MS / 1000
            raise ValidationError("deadAfter", f"must be at least {least:g} seconds: a worker "
                                  "beats every third of it")
        if not handler_wait_s > 0:
            raise ValidationError("handlerWait", "must be more than 0 seconds")
        if worker_id is not None and worker_id.startswith(keys.PARKED_CONSUMER):
            raise ValidationError("id", f"must not start with {keys.PARKED_CONSUMER!r}: that "
                                  "names the runs set aside for a job type")
        # --http: the built-in handler of HTTP target jobs, its settings from the environment
        # (imported only then: aiohttp is a tenth of a second of a worker's start)
        self.http: HttpTargets | None = None
        if http:
            from rsched.engine.worker.http_target import HttpSettings, HttpTargets
            self.http = HttpTargets(HttpSettings.from_env(), concurrency)
            app = self.http.register(app)
        self.app = app
        self.settings = settings
        self.queues = list(queues)
        self.concurrency = concurrency
        self.id = worker_id or process_id("w")
        self.visibility_ms = visibility_ms
        self.heartbeat_ms = heartbeat_ms
        self.outage = Outage(log)  # the fetch loop's and the heartbeat's view of Redis
        self.started = asyncio.Event()  # set once Redis answered and the loops began
        self.grace_s = grace_s
        self.flush_ms = flush_ms
        self.start_after_ms = start_after_ms
        # One kept connection per raw round trip it may have at once: reports and a read.
        r = connect_async(settings.redis_url, wait=settings.wait_replicas,
                          wait_timeout_ms=settings.wait_timeout_ms)
        self.link = Link(r, self.id, call_many=call_many or scripts.acall_many,
                         held=scripts.Held(FLUSHES_IN_FLIGHT + 1))
        # A read may go with a report only through the stock script sender (``call_many``
        # None): an injected one sees script calls alone.
        self._stock_sender = call_many is None
        self.read_along = ReadAlong()
        self.runs = Runs(concurrency)
        self.metrics = RunMetrics(inflight=self.runs.__len__)
        self._slot = asyncio.Event()  # set when a run may have left its slot
        self._few = min(defaults.FOCUS_COUNT, concurrency // 2)  # see _fetch_loop
        self.reporter = Reporter(self.link, settings, self.runs, self.metrics, self._slot,
                                 start_after_ms, self.read_along)
        self.runner = Runner(app, self.id, self.runs, self.reporter, self.metrics, self._slot,
                             concurrency, threads)
        self.handback = Handback(self.link, settings, self.metrics, self.queues,
                                 frozenset(app.handlers), int(handler_wait_s * 1000),
                                 visibility_ms)
        self.intake = Intake(self.link, self.runs, self.runner, self.reporter, self.metrics,
                             visibility_ms, self.handback,
                             frozenset(t.encode() for t in app.handlers))
        self.membership = Membership(self.link, settings, self.runs, self.reporter,
                                     self.metrics, self.queues, concurrency,
                                     sorted(app.handlers), self.handback.wait_ms,
                                     heartbeat_ms, dead_after_ms)
        self.flusher = Flusher(self.reporter, self.runner, flush_ms)
        self.liveness = Liveness(self.link, self.intake, self.membership.heartbeat_once,
                                 dead_after_ms)
        # Queue-wide limits: a permit expires when not kept for the visibility timeout, when
        # the run it covered would be reclaimed too.
        self.permits = Permits(self.link, self.queues, visibility_ms)
        self.runner.permits = self.permits

    # --- what other code and tests see ---------------------------------------------------------

    @property
    def done(self) -> list[Outcome]:
        """Outcomes waiting for their report."""
        return self.reporter.done

    @property
    def counts(self) -> dict[str, int]:
        """Reported outcomes by event (succeeded, fenced, retried, ...), from the run metrics."""
        out: dict[str, int] = defaultdict(int)
        for (event, _, _), n in list(self.metrics.counts.items()):
            out[event] += n
        return out

    # --- one step of each part (what the loops call, and tests drive) ---------------------------

    async def setup(self) -> None:
        """Check Redis, learn the partitions and join every stream's consumer group."""
        r = self.link.r
        await acheck_redis(r, self.settings.allow_unsafe_redis)
        n = await aensure_partitions(r, self.settings.initial_partitions,
                                     self.settings.strict_partitions)
        self.link.streams = {keys.stream(p, q): (p, q) for p in range(n) for q in self.queues}
        await self.permits.refresh_once()
        await self.membership.join()

    async def fetch_once(self, block_ms: int = 1000, streams: Sequence[str] | None = None) -> int:
        return await self.intake.fetch_once(block_ms, streams)

    async def reclaim_once(self) -> int:
        return await self.intake.reclaim_once()

    async def adopt_once(self) -> int:
        return await self.intake.adopt_once()

    async def start_once(self, min_age_ms: int | None = None) -> int:
        return await self.reporter.start_once(min_age_ms)

    async def flush_once(self) -> int:
        return await self.reporter.flush_once()

    async def heartbeat_once(self) -> int:
        lost = await self.membership.heartbeat_once()
        await self.permits.keep_once()
        return lost

    async def refresh_limits_once(self) -> int:
        return await self.permits.refresh_once()

    async def prune_consumers_once(self, idle_ms: int = defaults.CONSUMER_IDLE_MS) -> int:
        return await self.membership.prune_consumers_once(idle_ms)

    async def liveness_once(self) -> int:
        return await self.liveness.run_once()

    async def wait_handlers(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the running handlers; returns how many still run."""
        tasks = list(self.runner.tasks)
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        return len(pending)

    # --- the process ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch until ``stop``, then drain, report, leave and close."""
        if not await wait_for_redis(self.setup, self.settings.redis_url, stop):
            await self.close(wait_s=0)  # stopped before Redis came up
            return
        log.info("worker %s started: queues %s, concurrency %d", self.id,
                 ",".join(self.queues), self.concurrency)
        self.started.set()
        flusher = asyncio.create_task(self.flusher.run(stop))
        # An earlier process under this id (a supervisor's restarted child) died with runs
        # pending under it: take them over now, before reading anything new.
        try:
            await self.intake.take_over(self.id, 0)
        except Exception as e:  # noqa: BLE001 - others take them over, or the backstop does
            log.warning("could not take over runs left under this worker's id: %s", e)
        self.runner.progress_wake = asyncio.Event()
        progress = ProgressSender(
            lambda: self.membership.heartbeat_once(progress_only=True), self.runner.progress_wake,
            lambda: any(fl.progress_new for fl in self.runs.by_id.values()))
        # Heartbeats outlive `stop`: runs finishing within the grace period must stay ours.
        # Like heartbeats, starts (and timeouts) go on while running jobs drain.
        hb_stop = asyncio.Event()
        draining = [
            asyncio.create_task(Every(self.liveness_once, self.liveness.every_s,
                                      self.outage).run(hb_stop)),
            asyncio.create_task(Every(self.heartbeat_once, self.heartbeat_ms / 1000,
                                      self.outage).run(hb_stop)),
            asyncio.create_task(Every(self.start_once,
                                      max(self.start_after_ms / 2000, 0.005)).run(hb_stop)),
            asyncio.create_task(progress.run(hb_stop)),
        ]
        fetching = [
            asyncio.create_task(Every(self.reclaim_once,
                                      max(self.visibility_ms / 4000, 0.1)).run(stop)),
            asyncio.create_task(Every(self.prune_consumers_once, PRUNE_EVERY_S).run(stop)),
            asyncio.create_task(Every(self.refresh_limits_once,
                                      defaults.QUEUE_LIMITS_REFRESH_S).run(stop)),
            asyncio.create_task(self._adopt_loop(stop)),
        ]
        groups = same_slot_groups(self.link.r, self.link.streams)
        # One fetch loop (one pooled Redis): reads may go with reports (read_along).
        if groups == [None] and scripts.pooled(self.link.r) and self._stock_sender:
            self.read_along.open(self.intake)
        try:
            await asyncio.gather(*(self._fetch_loop(stop, group) for group in groups))
        finally:
            self.read_along.close()
            self.liveness.taking = False
            for t in fetching:
                t.cancel()
            await self.handback.settle()
            await self.runner.drain(self.grace_s)
            self.reporter.wake.set()
            try:
                await asyncio.wait_for(flusher, FLUSH_WAIT_S)
            except (TimeoutError, Exception):  # noqa: BLE001
                pass
            hb_stop.set()
            for t in draining:
                t.cancel()
            self.runner.deadlines.close()
            try:
                await self.membership.leave()
            except Exception as e:  # noqa: BLE001
                log.warning("could not deregister: %s", e)
            await self.close(wait_s=0)
            log.info("worker %s stopped", self.id)

    async def _fetch_loop(self, stop: asyncio.Event, streams: Sequence[str] | None) -> None:
        """Fetch (from ``streams``, None: all) while there are free slots; wait for one
        otherwise."""
        while not stop.is_set():
            free = self.runs.free()
            # Few free slots (under half) and outcomes waiting: their report, due within
            # flush_ms, reads for these slots and those it frees in its own round trip, not a
            # read each time a handler returned (half the round trips per run at concurrency
            # 16: loadtest/bench_phases.py).  Below concurrency 4 a slot never waits for that.
            few = free > 0  # then the report is what to wait for, not each handler's return
            if free <= 0 or (free < self._few and self.reporter.done
                             and self.read_along.is_open):
                wake = self.reporter.reported if few else self._slot
                wake.clear()
                with self.read_along.waiting(stop):  # meanwhile a report may read for us
                    try:  # a timeout scope, not wait_for: 3.11's wraps the wait in a task
                        async with asyncio.timeout(defaults.FOCUS_S if few else 0.5):
                            await wake.wait()
                    except TimeoutError:
                        pass
                continue
            try:
                await self.fetch_once(block_ms=500, streams=streams)
                self.outage.up()
            except ResponseError as e:
                log.warning("fetch: %s", e)
                if "NOGROUP" in str(e):
                    await self.setup()
                await asyncio.sleep(0.5)
            except Exception as e:
                if not is_unavailable(e):
                    raise
                log.warning("fetch: %s", e)
                self.outage.down(e, logged=True)
                await asyncio.sleep(0.5)

    async def _adopt_loop(self, stop: asyncio.Event) -> None:
        """Take runs other workers set aside for our handlers: every ADOPT_POLL_S, or at once
        again while some are known to be left (a busy shared queue sets many aside)."""
        while not stop.is_set():
            took = 0
            try:
                took = await self.adopt_once()
            except Exception as e:  # noqa: BLE001 - a loop must survive Redis hiccups
                log.warning("taking runs set aside: %s", e)
            pause = defaults.ADOPT_POLL_S
            if self.handback.more() and self.runs.free() <= 0:
                pause = ADOPT_BUSY_S  # no free slot: look again soon, without Redis until then
            elif self.handback.more() and took:
                pause = 0
            try:
                await asyncio.wait_for(stop.wait(), pause)
            except TimeoutError:
                pass

    async def close(self, wait_s: float = 2.0) -> None:
        """Let go of what the worker holds: handlers still running are cancelled (waiting up to
        ``wait_s``; their runs are left to be reclaimed, unreported), then the timeout timer,
        the handler threads and the connection.  ``run`` calls it after its drain."""
        await self.runner.close(wait_s)
        if self.http is not None:
            await self.http.close()
        await self.link.held.release()
        await self.link.r.aclose()


async def show_alive(path: str, started: asyncio.Event, stop: asyncio.Event,
                     worker_id: str) -> None:
    """For a supervisor (rsched.cli._supervisor): touch ``path`` every ALIVE_EVERY_S from this
    event loop, and write 'ready <worker id>' to it once the worker started (the supervisor
    hands that worker's runs over at once when the process dies)."""
    ready = False
    while not stop.is_set():
        if started.is_set() and not ready:
            with open(path, "wb") as f:
                f.write(b"ready " + worker_id.encode())
            ready = True
        else:
            with open(path, "ab"):
                os.utime(path)
        try:  # until ready, look often: the supervisor needs the id as soon as it runs
            await asyncio.wait_for(stop.wait(), defaults.ALIVE_EVERY_S if ready else 0.05)
        except TimeoutError:
            pass


def serve(app: App, settings: Settings, alive_file: str | None = None, **options: Any) -> None:
    """Run a worker until SIGINT/SIGTERM (then drain within the grace period); with
    ``alive_file``, show a supervisor it is alive (see show_alive)."""
    import signal

    async def main() -> None:
        aio.tune_gc()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        worker = Worker(app, settings, **options)
        shown = None if alive_file is None else asyncio.create_task(
            show_alive(alive_file, worker.started, stop, worker.id))
        await worker.run(stop)
        if shown is not None:
            await shown

    aio.run(main())
    # A sync handler still running past the grace period cannot be cancelled, and interpreter
    # exit would join its thread: leave without it (its run is reclaimed by another worker).
    if any(t.name.startswith("rsched-job") for t in threading.enumerate()):
        logging.shutdown()
        os._exit(0)
