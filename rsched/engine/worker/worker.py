"""The worker process.

Hot path per batch, not per job: one XREADGROUP for every stream, handlers start at once and
run concurrently, and outcomes are flushed every few milliseconds with one complete script per
partition, which also records the start of runs that finished quickly.  Only runs still going
after ``start_after_ms`` get a start script of their own (batched), which takes their fencing
token before any heartbeat; a run's start thus costs nothing extra on the hot path, and a long
run is recorded as running well within the visibility timeout.  Heartbeats keep the stream
entries of long runs fresh so XAUTOCLAIM in other workers only takes runs whose worker really
stopped.  Reclaimed runs are started (and fenced) before their handler runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from rsched.core.app import App, JobContext
from rsched.core.errors import ValidationError
from rsched.core.ids import ulid
from rsched.core.models import unpack_payload, unpack_spec
from rsched.core.retry import retry_delay_ms
from rsched.core.settings import Settings
from rsched.engine import aio
from rsched.obs.metrics import RunMetrics
from rsched.rdb import keys, scripts
from rsched.rdb.setup import (
    UNAVAILABLE,
    acheck_redis,
    aensure_partitions,
    connect_async,
    is_unavailable,
    wait_for_redis,
)

log = logging.getLogger("rsched.worker")

MAX_RESULT_BYTES = 16 * 1024
CONSUMER_IDLE_MS = 3_600_000  # a consumer this idle with nothing pending belonged to a dead worker
MAX_ERROR_CHARS = 2000
FLUSHES_IN_FLIGHT = 4
SPEC_CACHE = 4096  # distinct packed specs kept unpacked...
SPEC_CACHE_BYTES = 512  # ...of at most this size (a spec holds the payload: keep memory small)


class UnknownJobType(Exception):
    """No handler is registered for the job's type: fail loudly, never drop silently."""


@dataclass(slots=True)
class Inflight:
    partition: int
    stream: str
    entry_id: str
    run_id: str
    job_id: str
    fence: int  # 0 until its start is recorded; NOT_OURS once Redis said it is not ours to run
    attempt: int
    t0: float = 0.0  # perf_counter when the run was taken
    deadline: float = float("inf")  # loop time its handler times out
    task: asyncio.Task[Any] | None = None  # the handler's task, cancelled on timeout
    timed_out: bool = False
    starting: bool = False  # a start script for it is under way
    finished: bool = False  # its handler returned; the report records the start if need be
    run_key: str = ""  # where the run's fields live (the job hash for a one-off job's own run)
    job_key: str = ""
    sched_ms: int = 0
    type: str = ""
    queue: str = ""


NOT_OURS = -1  # Inflight.fence of a run Redis refused to us: never started, heartbeated, reported


def _inflight(p: int, stream: str, queue: str, eid: str, f: dict[bytes, bytes], attempt: int,
              t0: float) -> Inflight:
    """A run from its stream entry: the run id holds the job id and the scheduled time; 'o'
    marks a one-off job's own run, whose fields live in the job hash (lua/include/util.lua)."""
    rid = f[b"r"].decode()
    job_id, _, sched = rid.rpartition("@")
    job_key = keys.job(p, job_id)
    run_key = job_key if b"o" in f else keys.run(p, rid)
    return Inflight(p, stream, eid, rid, job_id, 0, attempt, t0, run_key=run_key,
                    job_key=job_key, sched_ms=int(sched), type=f[b"t"].decode(), queue=queue)


@dataclass(slots=True)
class Outcome:
    fl: Inflight
    status: str  # succeeded | failed | timed_out
    duration_ms: int
    text: str
    delay_ms: int
    type: str = ""
    queue: str = ""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Worker:
    def __init__(
        self,
        app: App,
        settings: Settings,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 16,
        worker_id: str | None = None,
        visibility_ms: int = 30_000,
        heartbeat_ms: int = 5_000,
        grace_s: float = 30.0,
        threads: int | None = None,
        flush_ms: float = 2.0,
        start_after_ms: int = 200,
    ) -> None:
        if heartbeat_ms * 2 > visibility_ms:
            raise ValidationError(
                "heartbeatMs", f"must be at most half of visibilityMs ({visibility_ms}), "
                "or live runs get reclaimed between two heartbeats")
        if concurrency < 1:
            raise ValidationError("concurrency", "must be at least 1")
        if start_after_ms < 0:
            # Heartbeats record every pending start first, so a start lands within
            # heartbeat_ms, well before the entry can look idle to other workers.
            raise ValidationError("startAfterMs", "must be 0 or more")
        self.app = app
        self.settings = settings
        self.queues = list(queues)
        self.concurrency = concurrency
        self.id = worker_id or f"w-{socket.gethostname()}-{os.getpid()}-{ulid()[-6:]}"
        self.visibility_ms = visibility_ms
        self.heartbeat_ms = heartbeat_ms
        self.grace_s = grace_s
        self.flush_ms = flush_ms
        self.start_after_ms = start_after_ms
        self.r: Redis = connect_async(settings.redis_url)
        self.pool = ThreadPoolExecutor(threads or concurrency, thread_name_prefix="rsched-job")
        self._sem = asyncio.Semaphore(concurrency)
        self.inflight: dict[str, Inflight] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.done: list[Outcome] = []
        self._done_evt = asyncio.Event()
        self._slot = asyncio.Event()
        self.streams: dict[str, tuple[int, str]] = {}
        self._cursors: dict[str, str] = {}
        self.metrics = RunMetrics(inflight=self.inflight.__len__)
        self._finished = 0  # in-flight runs whose handler has returned (report pending)
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = float("inf")
        self._specs: dict[bytes, dict[str, Any]] = {}

    @property
    def counts(self) -> dict[str, int]:
        """Reported outcomes by event (succeeded, fenced, retried, ...), from the run metrics."""
        out: dict[str, int] = defaultdict(int)
        for (event, _, _), n in list(self.metrics.counts.items()):
            out[event] += n
        return out

    # --- set-up ------------------------------------------------------------------------------

    async def setup(self) -> None:
        await acheck_redis(self.r, self.settings.allow_unsafe_redis)
        n = await aensure_partitions(self.r, self.settings.partitions or 16,
                                     bool(self.settings.partitions))
        self.streams = {keys.stream(p, q): (p, q) for p in range(n) for q in self.queues}
        pipe = self.r.pipeline(transaction=False)
        for s in self.streams:
            pipe.xgroup_create(s, keys.GROUP, id="0", mkstream=True)
        for res in await pipe.execute(raise_on_error=False):
            if isinstance(res, ResponseError) and "BUSYGROUP" not in str(res):
                raise res

    # --- fetching and starting ---------------------------------------------------------------

    def _free(self) -> int:
        """Slots for new runs.  A finished run waiting for its report holds no slot (up to
        ``concurrency`` of them), so the report's round trip never idles the handlers."""
        running = len(self.inflight) - self._finished
        return min(self.concurrency - running, 2 * self.concurrency - len(self.inflight))

    async def fetch_once(self, block_ms: int = 1000) -> int:
        """Read new entries from every stream (up to free capacity) and start them."""
        free = self._free()
        if free <= 0:
            return 0
        # COUNT applies per stream: split the free slots so one read cannot overshoot the
        # concurrency by more than one entry per stream (the semaphore in _handle holds those).
        count = max(1, free // len(self.streams))
        resp: Any = await self.r.xreadgroup(
            keys.GROUP, self.id, {s: ">" for s in self.streams}, count=count, block=block_ms
        )
        entries = [(_s(s), _s(eid), f) for s, items in resp or () for eid, f in items if f]
        return self._launch(entries)

    async def reclaim_once(self) -> int:
        """Take over entries idle longer than the visibility timeout (their worker is gone)."""
        free = self._free()
        if free <= 0:
            return 0
        names = list(self.streams)
        pipe = self.r.pipeline(transaction=False)
        for s in names:
            pipe.xautoclaim(s, keys.GROUP, self.id, self.visibility_ms,
                            start_id=self._cursors.get(s, "0-0"), count=free)
        entries = []
        for s, res in zip(names, await pipe.execute(raise_on_error=False), strict=False):
            if isinstance(res, Exception):
                continue
            self._cursors[s] = _s(res[0])
            entries += [(s, _s(eid), f) for eid, f in res[1] if f]
        entries = [e for e in entries if _s(e[2][b"r"]) not in self.inflight]
        if entries:
            log.info("reclaiming %d idle runs", len(entries))
        return await self._start(entries, reclaimed=True)

    def _launch(self, entries: list[tuple[str, str, dict[bytes, bytes]]]) -> int:
        """Run fresh entries at once; their start is recorded later (see the module doc)."""
        now_s, now, lag = time.time(), time.perf_counter(), self.metrics.lag
        started: dict[tuple[str, str], int] = defaultdict(int)
        for s, eid, f in entries:
            p, queue = self.streams[s]
            if f[b"r"].decode() in self.inflight:  # delivered again while still running here
                continue
            attempt = int(f[b"a"])
            fl = _inflight(p, s, queue, eid, f, attempt, now)
            started[(fl.type, queue)] += 1
            if attempt == 1:  # retries wait for their backoff on purpose
                lag.observe(queue, now_s - fl.sched_ms / 1000)
            self._run(fl, f)
        for (jtype, queue), n in started.items():
            self.metrics.count("started", jtype, queue, n)
        return len(entries)

    def _run(self, fl: Inflight, f: dict[bytes, bytes]) -> None:
        self.inflight[fl.run_id] = fl
        task = asyncio.create_task(self._handle(fl, f))
        fl.task = task
        self.tasks.add(task)

    def _spec(self, raw: bytes | None) -> dict[str, Any]:
        """A run's spec, unpacked once per distinct spec: jobs scheduled in a batch mostly share
        theirs.  Shared dicts are only read; the payload inside stays packed (unpacked per run)."""
        key = raw or b""
        sp = self._specs.get(key)
        if sp is None:
            sp = unpack_spec(raw)
            if len(key) <= SPEC_CACHE_BYTES:
                if len(self._specs) >= SPEC_CACHE:
                    self._specs.clear()
                self._specs[key] = sp
        return sp

    async def _start(self, entries: list[tuple[str, str, dict[bytes, bytes]]],
                     reclaimed: bool = False) -> int:
        """Reclaimed entries: take a new fencing token first, then run."""
        if not entries:
            return 0
        now = time.perf_counter()
        fls = []
        for s, eid, f in entries:
            p, queue = self.streams[s]
            fls.append(_inflight(p, s, queue, eid, f, 0, now))
        await self._record_starts(fls, reclaimed)
        started = 0
        for fl, (s, _, f) in zip(fls, entries, strict=True):
            if fl.fence > 0 and fl.run_id not in self.inflight:
                m, jtype, queue = self.metrics, _s(f[b"t"]), self.streams[s][1]
                m.count("started", jtype, queue)
                if reclaimed:
                    m.count("reclaimed", jtype, queue)
                self._run(fl, f)
                started += 1
        return started

    async def _record_starts(self, fls: list[Inflight], reclaimed: bool = False) -> None:
        """One start script per partition; sets each run's fence (0: not ours to run)."""
        by_part: dict[int, list[Inflight]] = defaultdict(list)
        for fl in fls:
            by_part[fl.partition].append(fl)
        calls: list[scripts.Call] = []
        now = time.perf_counter()
        for p, items in by_part.items():
            ks = [keys.events(p), keys.stats(p), keys.dead(p)]
            args: list[Any] = [self.id, 0, self.settings.events_maxlen, keys.GROUP, len(items),
                               self.settings.history_len]
            for fl in items:
                ks += [fl.run_key, fl.job_key, fl.stream, keys.history(p, fl.job_id)]
                args += [fl.run_id, fl.entry_id, int((now - fl.t0) * 1000), int(reclaimed)]
                fl.starting = True
            calls.append(("start", ks, args))
        try:
            results = await scripts.acall_many(self.r, calls)
        finally:
            for fl in fls:
                fl.starting = False
        for (p, items), res in zip(by_part.items(), results, strict=True):
            if isinstance(res, Exception):
                log.error("start on partition %d failed: %s", p, res)
                continue
            for i, fl in enumerate(items):
                fence, attempt = int(res[2 * i]), int(res[2 * i + 1])
                fl.fence = fence if fence > 0 else NOT_OURS  # never ask again
                fl.attempt = attempt or fl.attempt
                if fence < 0:
                    self._fenced(fl, "start")
                elif fence == 0 and not reclaimed:
                    log.warning("run %s is not this worker's to run (cancelled, finished or "
                                "re-dispatched meanwhile); its outcome will not be recorded",
                                fl.run_id, extra={"job_id": fl.job_id, "run_id": fl.run_id})
        if self.done:
            self._done_evt.set()  # outcomes held back while their start was under way

    async def start_once(self, min_age_ms: int | None = None) -> int:
        """Record the start of running runs older than ``min_age_ms`` (default start_after_ms)
        whose start is not recorded yet; returns how many."""
        age = (self.start_after_ms if min_age_ms is None else min_age_ms) / 1000
        cutoff = time.perf_counter() - age
        due = [fl for fl in self.inflight.values()
               if not fl.fence and not fl.starting and not fl.finished and fl.t0 <= cutoff]
        if due:
            await self._record_starts(due)
        return len(due)

    def _fenced(self, fl: Inflight, what: str) -> None:
        """Redis rejected our start or heartbeat of a run another worker holds now (we stalled
        past the visibility timeout and were reclaimed): count it, say so, never write again."""
        fl.fence = NOT_OURS
        self.metrics.count("fenced", fl.type, fl.queue)
        log.warning("run %s: %s rejected, its stream entry is delivered to another worker now "
                    "(reclaimed while this worker stalled); its outcome will not be recorded",
                    fl.run_id, what, extra={"job_id": fl.job_id, "run_id": fl.run_id})

    # --- running -----------------------------------------------------------------------------

    async def _handle(self, fl: Inflight, f: dict[bytes, bytes]) -> None:
        # Leaves the task set itself (a done callback per run cost another loop turn), in the
        # same coroutine (a wrapper coroutine per run cost a frame and a send).
        try:
            jtype = f[b"t"].decode()
            sp = self._spec(f.get(b"x"))
            timeout_s = int(sp.get("timeout_ms") or 300_000) / 1000
            await self._sem.acquire()
            t0 = time.perf_counter()
            loop = asyncio.get_running_loop()
            # One timer for the earliest deadline of all runs, not one per run (see _arm).
            fl.deadline = loop.time() + timeout_s
            if fl.deadline < self._expiry_at:
                self._arm(fl.deadline)
            status, text = "succeeded", "null"
            try:
                reg = self.app.handlers.get(jtype)
                if reg is None:
                    raise UnknownJobType(
                        f"no handler registered for job type {jtype!r} in app {self.app.name!r} "
                        f"(registered: {', '.join(sorted(self.app.handlers)) or 'none'})"
                    )
                ctx = JobContext(fl.job_id, fl.run_id, jtype, fl.attempt, fl.sched_ms,
                                 unpack_payload(sp.get("payload")), self.id)
                if reg.is_async:
                    result = await reg.fn(ctx)
                else:
                    # A sync handler past its timeout keeps its thread (Python cannot stop it).
                    result = await loop.run_in_executor(self.pool, reg.fn, ctx)
                text = "null" if result is None else _encode_result(result)
            except asyncio.CancelledError:
                if fl.timed_out:
                    status, text = "timed_out", f"timed out after {timeout_s:g} s"
                else:
                    self.inflight.pop(fl.run_id, None)
                    self._slot.set()
                    raise  # shutdown past the grace period: no report, the run will be reclaimed
            except Exception as e:  # noqa: BLE001 - any handler error is a failed attempt
                status, text = "failed", f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]
            finally:
                self._sem.release()
                fl.deadline = float("inf")
            duration = int((time.perf_counter() - t0) * 1000)
            delay = 0
            if status != "succeeded":
                delay = retry_delay_ms(fl.attempt, int(sp.get("backoff_base_ms", 1000)),
                                       int(sp.get("backoff_cap_ms", 3_600_000)))
                log.warning("run %s attempt %d %s: %s", fl.run_id, fl.attempt, status, text,
                            extra={"job_id": fl.job_id, "run_id": fl.run_id, "attempt": fl.attempt})
            self.metrics.duration.observe(jtype, duration / 1000)
            self.done.append(Outcome(fl, status, duration, text, delay, jtype,
                                     self.streams[fl.stream][1]))
            self._finished += 1
            fl.finished = True
            self._done_evt.set()
            self._slot.set()
        finally:
            self.tasks.discard(fl.task)

    def _arm(self, at: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = at
        self._expiry = asyncio.get_running_loop().call_at(at, self._expire)

    def _expire(self) -> None:
        """Cancel handlers past their timeout (reported as timed_out), then re-arm the timer
        for the earliest deadline left: most runs end long before theirs, so this runs about
        once per timeout period, at O(in-flight) each time."""
        self._expiry, self._expiry_at = None, float("inf")
        now = asyncio.get_running_loop().time()
        nxt = float("inf")
        for fl in list(self.inflight.values()):
            if fl.deadline <= now and fl.task is not None and not fl.task.done():
                fl.timed_out = True
                fl.task.cancel()
                fl.deadline = float("inf")
            elif fl.deadline < nxt:
                nxt = fl.deadline
        if nxt < float("inf"):
            self._arm(nxt)

    async def flush_once(self) -> int:
        """Report finished runs, one complete script per partition; keep them on Redis errors."""
        # A run whose start script is under way waits for its fence.
        batch = [o for o in self.done if not o.fl.starting]
        if len(batch) == len(self.done):
            self.done = []
        else:
            self.done = [o for o in self.done if o.fl.starting]
        if any(o.fl.fence == NOT_OURS for o in batch):
            batch = self._drop_not_ours(batch)
        if not batch:
            return 0
        by_part: dict[int, list[Outcome]] = defaultdict(list)
        for o in batch:
            by_part[o.fl.partition].append(o)
        calls: list[scripts.Call] = []
        now = time.perf_counter()
        for p, items in by_part.items():
            ks = [keys.events(p), keys.stats(p), keys.retry(p), keys.dead(p)]
            args: list[Any] = [self.id, 0, self.settings.events_maxlen, keys.GROUP, len(items),
                               self.settings.history_len, self.settings.run_ttl_ms,
                               self.settings.finished_ttl_ms]
            for o in items:
                fl = o.fl
                ks += [fl.run_key, fl.job_key, keys.history(p, fl.job_id), fl.stream]
                args += [fl.run_id, fl.fence, o.status, o.duration_ms, o.text, o.delay_ms,
                         fl.entry_id, int((now - fl.t0) * 1000)]
            calls.append(("complete", ks, args))
        try:
            results = await scripts.acall_many(self.r, calls)
        except UNAVAILABLE as e:
            log.warning("cannot report %d outcomes (%s); will retry", len(batch), e)
            self.done = batch + self.done
            return 0
        retry_later: list[Outcome] = []
        for (p, items), res in zip(by_part.items(), results, strict=False):
            if isinstance(res, Exception):
                log.error("complete on partition %d failed: %s", p, res)
                retry_later += items
                continue
            counted: dict[tuple[str, str, str], int] = defaultdict(int)
            for o, code in zip(items, res, strict=False):
                code, fl = int(code), o.fl
                if code > 0:
                    counted[(o.status, o.type, o.queue)] += 1
                if self.inflight.pop(fl.run_id, None) is not None:
                    self._finished -= 1
                if code == 1 or code == 0:
                    continue
                ids = {"job_id": fl.job_id, "run_id": fl.run_id, "attempt": fl.attempt}
                if code == -1:
                    self.metrics.count("fenced", o.type, o.queue)
                    log.warning("run %s: result rejected, fence %d is stale (run was reclaimed, "
                                "or not this worker's)", fl.run_id, fl.fence, extra=ids)
                elif code == 2:
                    self.metrics.count("retried", o.type, o.queue)
                elif code == 3:
                    self.metrics.count("dead_lettered", o.type, o.queue)
                    log.error("ALERT run %s dead-lettered: %s", fl.run_id, o.text, extra=ids)
            for (status, jtype, queue), n in counted.items():
                self.metrics.count(status, jtype, queue, n)
        self.done = retry_later + self.done
        self._slot.set()
        return len(batch) - len(retry_later)

    def _drop_not_ours(self, batch: list[Outcome]) -> list[Outcome]:
        """Forget outcomes of runs Redis refused to us (said and counted when it refused)."""
        keep = []
        for o in batch:
            if o.fl.fence != NOT_OURS:
                keep.append(o)
            elif self.inflight.pop(o.fl.run_id, None) is not None:
                self._finished -= 1
        return keep

    async def heartbeat_once(self) -> int:
        """Refresh every in-flight run's entry; returns how many runs were found lost.

        Runs whose start is not recorded yet get it first, whatever their age."""
        await self.start_once(min_age_ms=0)
        by_part: dict[int, list[Inflight]] = defaultdict(list)
        for fl in list(self.inflight.values()):
            if fl.fence > 0:
                by_part[fl.partition].append(fl)
        calls: list[scripts.Call] = []
        for p, items in by_part.items():
            ks: list[str] = [keys.events(p), keys.stats(p)]
            args: list[Any] = [self.id, 0, keys.GROUP, len(items), self.settings.events_maxlen]
            for fl in items:
                ks += [fl.run_key, fl.job_key, fl.stream]
                args += [fl.run_id, fl.fence, fl.entry_id]
            calls.append(("heartbeat", ks, args))
        lost = 0
        results = await scripts.acall_many(self.r, calls)
        for items, res in zip(by_part.values(), results, strict=True):
            if isinstance(res, Exception):
                continue
            for fl, code in zip(items, res, strict=False):
                if int(code) < 0 and fl.fence > 0:
                    self._fenced(fl, "heartbeat")
                if int(code) <= 0 and fl.run_id in self.inflight:
                    lost += 1
        await self.r.hset(keys.workers(), self.id, msgpack.packb({
            "queues": self.queues, "inflight": len(self.inflight), "pid": os.getpid(),
            "host": socket.gethostname(), "beat_ms": int(time.time() * 1000),
            "concurrency": self.concurrency,
            "metrics": self.metrics.heartbeat(),
        }))
        return lost

    # --- loops -------------------------------------------------------------------------------

    async def _loop(self, stop: asyncio.Event, fn: Any, every_s: float) -> None:
        while not stop.is_set():
            try:
                await fn()
            except Exception as e:  # noqa: BLE001 - a loop must survive Redis hiccups
                log.warning("%s: %s", fn.__name__, e)
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass

    async def _flusher(self, stop: asyncio.Event) -> None:
        """Report outcomes every flush_ms, up to FLUSHES_IN_FLIGHT reports at once: a report
        waits its turn behind other clients' scripts in Redis, and the handlers should not."""
        slots = asyncio.Semaphore(FLUSHES_IN_FLIGHT)
        reports: set[asyncio.Task[None]] = set()

        async def report() -> None:
            try:
                if not await self.flush_once() and self.done:
                    await asyncio.sleep(0.2)  # nothing got through (Redis away): don't spin
            except Exception as e:  # noqa: BLE001
                log.warning("flush: %s", e)
                await asyncio.sleep(0.2)
            finally:
                slots.release()
            if self.done:
                self._done_evt.set()

        while not (stop.is_set() and not self.done and not self.tasks):
            await self._done_evt.wait()
            self._done_evt.clear()
            await asyncio.sleep(self.flush_ms / 1000)
            await slots.acquire()
            task = asyncio.create_task(report())
            reports.add(task)
            task.add_done_callback(reports.discard)
        if reports:
            await asyncio.wait(reports)

    async def run(self, stop: asyncio.Event) -> None:
        if not await wait_for_redis(self.setup, self.settings.redis_url, stop):
            await self.r.aclose()  # stopped before Redis came up
            return
        log.info("worker %s started: queues %s, concurrency %d", self.id,
                 ",".join(self.queues), self.concurrency)
        flusher = asyncio.create_task(self._flusher(stop))
        # Heartbeats outlive `stop`: runs finishing within the grace period must stay ours.
        hb_stop = asyncio.Event()
        hb = asyncio.create_task(
            self._loop(hb_stop, self.heartbeat_once, self.heartbeat_ms / 1000)
        )
        rc = asyncio.create_task(
            self._loop(stop, self.reclaim_once, max(self.visibility_ms / 4000, 0.1))
        )
        # Like heartbeats, starts and timeouts go on while running jobs drain.
        st = asyncio.create_task(
            self._loop(hb_stop, self.start_once, max(self.start_after_ms / 2000, 0.005)))

        pruner = asyncio.create_task(self._loop(stop, self.prune_consumers_once, 300))
        try:
            while not stop.is_set():
                if self._free() <= 0:
                    self._slot.clear()
                    try:
                        await asyncio.wait_for(self._slot.wait(), 0.5)
                    except TimeoutError:
                        pass
                    continue
                try:
                    await self.fetch_once(block_ms=500)
                except ResponseError as e:
                    log.warning("fetch: %s", e)
                    if "NOGROUP" in str(e):
                        await self.setup()
                    await asyncio.sleep(0.5)
                except Exception as e:
                    if not is_unavailable(e):
                        raise
                    log.warning("fetch: %s", e)
                    await asyncio.sleep(0.5)
        finally:
            rc.cancel()
            pruner.cancel()
            await self._drain()
            self._done_evt.set()
            try:
                await asyncio.wait_for(flusher, 5)
            except (TimeoutError, Exception):  # noqa: BLE001
                pass
            hb_stop.set()
            for t in (hb, st):
                t.cancel()
            if self._expiry is not None:
                self._expiry.cancel()
            try:
                await self._deregister()
            except Exception as e:  # noqa: BLE001
                log.warning("could not deregister: %s", e)
            self.pool.shutdown(wait=False, cancel_futures=True)
            await self.r.aclose()
            log.info("worker %s stopped", self.id)

    async def prune_consumers_once(self, idle_ms: int = CONSUMER_IDLE_MS) -> int:
        """Delete consumers of killed workers: idle for ``idle_ms`` with nothing pending.

        A consumer with pending entries is kept (XAUTOCLAIM moves its runs first); a live
        worker reads every half second, and a deleted live consumer is recreated by its next read.
        """
        names = list(self.streams)
        pipe = self.r.pipeline(transaction=False)
        for s in names:
            pipe.xinfo_consumers(s, keys.GROUP)
        pipe2 = self.r.pipeline(transaction=False)
        doomed = 0
        for s, consumers in zip(names, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(consumers, Exception):
                continue
            for c in consumers:
                name = _s(c["name"])
                if name != self.id and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                    pipe2.xgroup_delconsumer(s, keys.GROUP, name)
                    doomed += 1
        if doomed:
            await pipe2.execute(raise_on_error=False)
        return doomed

    async def _deregister(self) -> None:
        """Leave the registry and the consumer groups, except where entries still wait for
        reclaim under our name (deleting the consumer would drop them from the group)."""
        await self.r.hdel(keys.workers(), self.id)
        names = list(self.streams)
        pipe = self.r.pipeline(transaction=False)
        for s in names:
            pipe.xpending_range(s, keys.GROUP, "-", "+", 1, consumername=self.id)
        mine = await pipe.execute(raise_on_error=False)
        pipe = self.r.pipeline(transaction=False)
        for s, pending in zip(names, mine, strict=False):
            if isinstance(pending, list) and not pending:
                pipe.xgroup_delconsumer(s, keys.GROUP, self.id)
        await pipe.execute(raise_on_error=False)

    async def _drain(self) -> None:
        """Let running jobs finish within the grace period; the rest are left to be reclaimed."""
        if self.tasks:
            log.info("waiting up to %.0f s for %d running jobs", self.grace_s, len(self.tasks))
            _, pending = await asyncio.wait(list(self.tasks), timeout=self.grace_s)
            for t in pending:
                t.cancel()
            if pending:
                log.warning("%d runs left to be reclaimed by other workers", len(pending))
                await asyncio.wait(pending, timeout=1)


def _encode_result(result: Any) -> str:
    try:
        text = json.dumps(result, default=str, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        text = json.dumps({"unserializable": str(e)[:200]})
    if len(text) > MAX_RESULT_BYTES:
        text = json.dumps({"truncated": True, "bytes": len(text)})
    return text


def serve(app: App, settings: Settings, **options: Any) -> None:
    """Run a worker until SIGINT/SIGTERM (then drain within the grace period)."""
    import signal

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await Worker(app, settings, **options).run(stop)

    aio.run(main())
    # A sync handler still running past the grace period cannot be cancelled, and interpreter
    # exit would join its thread: leave without it (its run is reclaimed by another worker).
    if any(t.name.startswith("rsched-job") for t in threading.enumerate()):
        logging.shutdown()
        os._exit(0)
