"""Running handlers: one task per run, a count of slots for the concurrency, one timer for every
run's timeout, and the outcome handed to the reporter."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rsched.core import defaults
from rsched.core.handlers import App, AttemptFailed, JobContext, RateLimited
from rsched.core.lifecycle import life_of
from rsched.core.models import PACKED_NONE, Overlap, unpack_payload, unpack_spec
from rsched.core.retry import retry_delay_ms
from rsched.core.values import TOO_DEEP, VALUE_DEPTH, shallow_json, too_deep
from rsched.core.wire import ENTRY_SPEC
from rsched.engine.worker._failure import MAX_ERROR_CHARS, failure_text
from rsched.engine.worker.inflight import NOT_OURS, Inflight, Outcome, Runs
from rsched.engine.worker.permits import Permits
from rsched.engine.worker.reporter import Reporter
from rsched.obs.metrics import RunMetrics

log = logging.getLogger("rsched.worker")

MAX_RESULT_BYTES = 16 * 1024
FINAL = -1  # a failed attempt's retry delay that dead-letters its run at once (complete.lua)
STOPPED = "cancelled: overlap cancelPrevious, a later occurrence replaces it"  # as in the Lua
SPEC_CACHE = 4096  # distinct packed specs kept unpacked...
SPEC_CACHE_BYTES = 512  # ...of at most this size (a spec holds the payload: keep memory small)


class UnknownJobType(Exception):
    """No handler is registered for the job's type: fail loudly, never drop silently."""


class UnserializableResult(Exception):
    """The handler returned what JSON cannot hold, or a value nested deeper than VALUE_DEPTH:
    the attempt fails rather than storing the value's str() as if it were the result, or a
    value every reader would have to replace."""


@dataclass(frozen=True, slots=True)
class Spec:
    """What a run needs of its job's spec, read once per distinct packed spec (Runner._spec)."""

    sp: dict[str, Any]  # unpack_spec's dict, shared: only read
    timeout_s: float
    start_deadline: bool  # the job has startDeadlineSeconds: a first attempt asks expire.lua
    stoppable: bool  # overlap cancelPrevious: asks whether the run was asked to stop first
    payload: Any  # still packed: unpacked per run, so no handler sees another's changes;
    # None for a packed None (a job without payload), which each run would unpack to None

    @classmethod
    def of(cls, raw: bytes | None) -> Spec:
        sp = unpack_spec(raw)
        life = sp.get("life")
        payload = sp.get("payload")
        return cls(sp, int(sp.get("timeout_ms") or defaults.TIMEOUT_MS) / 1000,
                   bool(life) and life_of(life).start_deadline_ms > 0,
                   sp.get("overlap") == Overlap.CANCEL_PREVIOUS.value,
                   None if payload == PACKED_NONE else payload)


class Deadlines:
    """One timer for the earliest deadline of all runs, not one per run: most runs end long
    before theirs, so it fires about once per timeout period, at O(in-flight) each time."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.at = float("inf")  # when the armed timer fires (loop time)
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, at: float) -> None:
        """Fire at ``at`` instead of later (the caller checked ``at < self.at``)."""
        if self._timer is not None:
            self._timer.cancel()
        self.at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._expire)

    def _expire(self) -> None:
        """Cancel handlers past their timeout (reported as timed_out), then re-arm the timer
        for the earliest deadline left."""
        self._timer, self.at = None, float("inf")
        now = asyncio.get_running_loop().time()
        nxt = float("inf")
        for fl in list(self.runs.by_id.values()):
            if fl.deadline <= now and fl.task is not None and not fl.task.done():
                fl.timed_out = True
                fl.task.cancel()
                fl.deadline = float("inf")
            elif fl.deadline < nxt:
                nxt = fl.deadline
        if nxt < float("inf"):
            self.arm(nxt)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Runner:
    """Runs handlers for the runs the intake takes, and hands their outcomes to the reporter."""

    def __init__(self, app: App, worker_id: str, runs: Runs, reporter: Reporter,
                 metrics: RunMetrics, slot: asyncio.Event, concurrency: int,
                 threads: int | None) -> None:
        self.app = app
        self.worker_id = worker_id
        self.runs = runs
        self.reporter = reporter
        self.metrics = metrics
        self.slot = slot  # set when a run leaves its slot
        self.progress_wake: asyncio.Event | None = None  # set when a run reports progress
        self.pool = ThreadPoolExecutor(threads or concurrency, thread_name_prefix="rsched-job")
        self.tasks: set[asyncio.Task[None]] = set()
        self.deadlines = Deadlines(runs)
        self.concurrency = concurrency
        # Handlers running, and those waiting for one of them to end (see _wait_turn): a
        # counter, not an asyncio.Semaphore, whose acquire and release cost four Python calls
        # per run (its locked() scans the waiters with a generator each time).
        self._running = 0
        self._queued: deque[asyncio.Future[None]] = deque()
        self._specs: dict[bytes | None, Spec] = {}
        self.permits: Permits | None = None  # queue-wide limits (set by the Worker)

    def run(self, fl: Inflight, f: dict[bytes, bytes]) -> None:
        """Start a run's handler now."""
        self.runs.by_id[fl.run_id] = fl
        # The loop's own create_task: asyncio.create_task adds two Python frames per run.
        task = asyncio.get_running_loop().create_task(self._handle(fl, f))
        fl.task = task
        self.tasks.add(task)

    def _spec(self, raw: bytes | None) -> Spec:
        """A run's spec, unpacked once per distinct spec: jobs scheduled in a batch mostly share
        theirs.  Shared dicts are only read; the payload inside stays packed (unpacked per run)."""
        spec = self._specs.get(raw)
        if spec is None:
            spec = Spec.of(raw)
            if len(raw or b"") <= SPEC_CACHE_BYTES:
                if len(self._specs) >= SPEC_CACHE:
                    self._specs.clear()
                self._specs[raw] = spec
        return spec

    async def _wait_turn(self) -> None:
        """Wait until a running handler hands its slot over (_leave): the intake reads no more
        than the free slots, but a read of every stream may take one entry a stream more."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if not fut.cancelled():  # handed a slot just as it was cancelled: pass it on
                self._leave()
            raise

    def _leave(self) -> None:
        """A handler's slot is free: to the first waiter still waiting, or back to the count."""
        queued = self._queued
        while queued:
            fut = queued.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._running -= 1

    async def _handle(self, fl: Inflight, f: dict[bytes, bytes]) -> None:
        # Leaves the task set itself (a done callback per run cost another loop turn), in the
        # same coroutine (a wrapper coroutine per run cost a frame and a send); one function,
        # since each helper call here is per job.
        try:
            jtype = fl.type
            raw = f.get(ENTRY_SPEC)
            spec = self._specs.get(raw) or self._spec(raw)
            timeout_s = spec.timeout_s
            if self._running < self.concurrency and not self._queued:
                self._running += 1
            else:
                await self._wait_turn()
            if spec.start_deadline and fl.attempt == 1 and await self._missed_start(fl):
                return
            if spec.stoppable and not fl.stop and await self._stop_asked(fl):
                fl.stop = True  # asked while it was queued: its handler never starts (below)
            permits = self.permits
            if permits is not None and not fl.stop and fl.queue in permits.limited:
                wait = await permits.take(fl)
                if wait:  # its queue is at its limit: not run, it waits (no attempt spent)
                    self._leave()
                    self._finish(Outcome(fl, "held", 0, f"held by the limit of queue {fl.queue}",
                                         wait, jtype, fl.queue))
                    return
            t0 = time.perf_counter()
            loop = asyncio.get_running_loop()
            fl.deadline = loop.time() + timeout_s
            if fl.deadline < self.deadlines.at:
                self.deadlines.arm(fl.deadline)
            status, text = "succeeded", "null"
            try:
                reg = self.app.handlers.get(jtype)
                if reg is None:
                    raise UnknownJobType(
                        f"no handler registered for job type {jtype!r} in app {self.app.name!r} "
                        f"(registered: {', '.join(sorted(self.app.handlers)) or 'none'})"
                    )
                payload = spec.payload
                ctx = JobContext(fl.job_id, fl.run_id, jtype, fl.attempt, fl.sched_ms,
                                 unpack_payload(payload) if payload else None, self.worker_id,
                                 reporter=self._progress_of(fl, loop), queue=fl.queue)
                fl.ctx = ctx
                if fl.stop:  # asked to stop before its handler started: it never starts
                    raise asyncio.CancelledError
                if reg.is_async:
                    result = await reg.fn(ctx)
                else:
                    result = await self._in_thread(fl, reg.fn, ctx)
                text = "null" if result is None else encode_result(result)
            except asyncio.CancelledError:
                if fl.timed_out:
                    status, text = "timed_out", f"timed out after {timeout_s:g} s"
                elif not fl.stop:
                    self.runs.by_id.pop(fl.run_id, None)
                    self.slot.set()
                    if permits is not None:  # a sync handler may still run: its permit expires
                        permits.held.pop(fl.run_id, None)
                    raise  # shutdown past the grace period: no report, the run will be reclaimed
            except RateLimited as e:  # waits, no attempt spent (complete.lua 'deferred')
                status, text = "deferred", str(e)
                fl.defer_ms = int(e.retry_after * 1000)
            except AttemptFailed as e:  # the handler's own reason, no traceback
                status, text = "failed", str(e)[:MAX_ERROR_CHARS]
                fl.failed = e
            except Exception as e:  # noqa: BLE001 - any handler error is a failed attempt
                status, text = "failed", failure_text(e)
            finally:
                self._leave()
                fl.deadline = float("inf")
                if permits is not None and fl.run_id in permits.held:
                    await permits.give(fl)
            if fl.stop and status != "timed_out":  # whatever the handler did once asked
                status, text = "cancelled", STOPPED
            duration = int((time.perf_counter() - t0) * 1000)
            delay = 0
            if status == "deferred":
                delay = fl.defer_ms
            elif status != "succeeded":
                sp = spec.sp
                cap = int(sp.get("backoff_cap_ms", defaults.BACKOFF_CAP_MS))
                delay = retry_delay_ms(
                    fl.attempt, int(sp.get("backoff_base_ms", defaults.BACKOFF_BASE_MS)), cap)
                if fl.failed is not None:
                    delay = failed_delay_ms(fl.failed, delay, cap)
                if fl.phase is not NOT_OURS:  # else said when Redis refused it to us
                    log.warning("run %s attempt %d %s: %s", fl.run_id, fl.attempt, status,
                                text.partition("\n")[0], extra={
                                    "job_id": fl.job_id, "run_id": fl.run_id,
                                    "attempt": fl.attempt})
            self.metrics.duration.observe(jtype, duration / 1000)
            self._finish(Outcome(fl, status, duration, text, delay, jtype, fl.queue))
        finally:
            self.tasks.discard(fl.task)

    def _finish(self, outcome: Outcome) -> None:
        """A run's outcome to the reporter; its slot is free."""
        rep = self.reporter
        rep.done.append(outcome)
        runs = self.runs
        runs.finished += 1
        outcome.fl.finished = True
        if runs.finished == len(runs.by_id):
            rep.settled.set()
        rep.wake.set()
        self.slot.set()

    async def _missed_start(self, fl: Inflight) -> bool:
        """A job with startDeadlineSeconds: True if Redis dead-lettered this run for starting
        past it (lua/expire.lua), which then leaves its slot unrun; else it runs now."""
        try:
            missed = await self.reporter.expire(fl)
        except Exception as e:  # noqa: BLE001 - unasked, it is not run: reclaimed later
            log.error("run %s: its start deadline could not be checked (%s); left to be "
                      "reclaimed", fl.run_id, e, extra={"job_id": fl.job_id, "run_id": fl.run_id})
            missed = True
        if missed:
            self._leave()
            self.runs.by_id.pop(fl.run_id, None)
            self.slot.set()
            log.warning("run %s missed its start deadline: dead-lettered, not run", fl.run_id,
                        extra={"job_id": fl.job_id, "run_id": fl.run_id, "attempt": fl.attempt})
        return missed

    async def _stop_asked(self, fl: Inflight) -> bool:
        """Whether cancelPrevious asked this run to stop while it was queued: one read of its
        job's record, so it is not run until its first heartbeat says so.  Unread (Redis
        unavailable), it runs: its heartbeat still tells."""
        try:
            return await self.reporter.stop_asked(fl)
        except Exception as e:  # noqa: BLE001 - the heartbeat is the guarantee; this saves time
            log.warning("run %s: whether it was asked to stop could not be read (%s)",
                        fl.run_id, e, extra={"job_id": fl.job_id, "run_id": fl.run_id})
            return False

    async def _in_thread(self, fl: Inflight, fn: Any, ctx: JobContext) -> Any:
        """A sync handler in the pool.  Past its timeout Python cannot stop its thread, so the
        outcome (and with it the retry) waits until the thread returns: two attempts of a run
        never execute at once.  The run stays in flight meanwhile, its entry heartbeated."""
        fut = asyncio.get_running_loop().run_in_executor(self.pool, fn, ctx)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not (fl.timed_out or fl.stop):
                raise  # shutdown: the run is left to be reclaimed once this process is gone
            if fl.timed_out:
                log.warning("run %s attempt %d timed out; its sync handler still runs in its "
                            "thread, and the retry waits until it returns", fl.run_id,
                            fl.attempt, extra={"job_id": fl.job_id, "run_id": fl.run_id,
                                               "attempt": fl.attempt})
            try:
                await asyncio.wait([fut])
            except asyncio.CancelledError:
                fl.timed_out = False  # shutdown while held: not reported, as above
            raise

    def _progress_of(self, fl: Inflight, loop: asyncio.AbstractEventLoop
                     ) -> Callable[[str], None]:
        """A run's progress reporter: keeps the latest report with the run and wakes the
        worker's ProgressSender once per batch of reports (from a sync handler's thread too)."""
        def report(text: str) -> None:
            fl.progress = text
            if not fl.progress_new:
                fl.progress_new = True
                if self.progress_wake is not None:
                    loop.call_soon_threadsafe(self.progress_wake.set)
        return report

    async def drain(self, grace_s: float) -> None:
        """Let running jobs finish within the grace period; the rest are left to be reclaimed."""
        if self.tasks:
            log.info("waiting up to %.0f s for %d running jobs", grace_s, len(self.tasks))
            _, pending = await asyncio.wait(list(self.tasks), timeout=grace_s)
            for t in pending:
                t.cancel()
            if pending:
                log.warning("%d runs left to be reclaimed by other workers", len(pending))
                await asyncio.wait(pending, timeout=1)

    async def close(self, wait_s: float) -> None:
        """Cancel what still runs, waiting up to ``wait_s`` (0: leave it, as after a drain; no
        report: reclaimed elsewhere), stop the timer and let go of the threads."""
        if wait_s > 0 and self.tasks:
            for t in list(self.tasks):
                t.cancel()
            await asyncio.wait(list(self.tasks), timeout=wait_s)
        self.deadlines.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def failed_delay_ms(e: AttemptFailed, backoff_ms: int, cap_ms: int) -> int:
    """The retry delay of an attempt that raised AttemptFailed: FINAL, or the backoff raised
    to its retry_after (at most the job's backoff cap)."""
    if e.final:
        return FINAL
    if e.retry_after is None:
        return backoff_ms
    return max(backoff_ms, min(int(math.ceil(e.retry_after * 1000)), cap_ms))


def encode_result(result: Any) -> str:
    """A handler's result as the JSON the run keeps, bounded so one result cannot bloat Redis;
    UnserializableResult (the attempt fails saying why) when it is no JSON (an object, a set,
    NaN, a cycle), nests too deep or is over MAX_RESULT_BYTES."""
    try:
        text = json.dumps(result, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        text = ""  # deeper than Python's recursion limit: far too deep
    except (TypeError, ValueError) as e:
        raise UnserializableResult(
            f"the result could not be serialized as JSON: {str(e)[:200]}") from None
    if not text or not shallow_json(text) and too_deep(result):
        raise UnserializableResult(f"the result is {TOO_DEEP}, over the limit of {VALUE_DEPTH}; "
                                   "return a flatter value")
    if len(text) > MAX_RESULT_BYTES:  # refused, never kept cut short
        raise UnserializableResult(
            f"the result is {len(text):,} bytes of JSON, over the limit of "
            f"{MAX_RESULT_BYTES:,} bytes; return less (a reference to where the data is)")
    return text
