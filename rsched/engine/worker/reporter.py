"""Recording runs in Redis: their start (start.lua) and their outcome (complete.lua).

A fresh run's handler starts before its start is recorded.  If it returns within
``start_after_ms``, one complete script per partition records both its start and its outcome
(one script call per run instead of two on the hot path); a run still going by then gets a
start script of its own, batched, which takes its fencing token before any heartbeat.  The two
can meet, and this module is the one place that orders them:

* a finished run is never started on its own: its report records the start;
* an outcome waits while its run's start script is under way, then goes with the new token
  (or is dropped if Redis refused the run to us).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any

from rsched.core.codes import CompleteCode, ExpireCode, StartFence
from rsched.core.settings import Settings
from rsched.engine.worker._link import Link
from rsched.engine.worker.inflight import (
    NOT_OURS,
    NOT_STARTED,
    STARTED,
    STARTING,
    Inflight,
    Outcome,
    Runs,
)
from rsched.engine.worker.read_along import ReadAlong
from rsched.obs.metrics import RunMetrics
from rsched.rdb import run_scripts, scripts
from rsched.rdb.job_reads import op_stop_asked
from rsched.rdb.ops import arun
from rsched.rdb.run_scripts import ADOPTED, FRESH, RECLAIMED
from rsched.rdb.setup import UNAVAILABLE

log = logging.getLogger("rsched.worker")

# Compared per reported run: plain ints, which save an attribute lookup on the enum class and
# the subclass check an int == IntEnum comparison makes.
_SUCCEEDED, _DUPLICATE = int(CompleteCode.SUCCEEDED), int(CompleteCode.DUPLICATE)


class Reporter:
    """Starts and outcomes of this worker's runs, batched per partition."""

    def __init__(self, link: Link, settings: Settings, runs: Runs, metrics: RunMetrics,
                 slot: asyncio.Event, start_after_ms: int, read_along: ReadAlong) -> None:
        self.link = link
        self.settings = settings
        self.runs = runs
        self.metrics = metrics
        self.slot = slot  # set when a report frees slots for new runs
        self.start_after_ms = start_after_ms
        self.done: list[Outcome] = []  # outcomes waiting for their report
        self.wake = asyncio.Event()  # set when there may be something to report
        self.read_along = read_along  # the fetch loop's read a report may carry
        self.reported = asyncio.Event()  # set after each report
        self.settled = asyncio.Event()  # set when every run in flight has finished (Flusher)

    # --- starts ------------------------------------------------------------------------------

    async def start_once(self, min_age_ms: int | None = None) -> int:
        """Record the start of running runs older than ``min_age_ms`` (default start_after_ms)
        whose start is not recorded yet; returns how many."""
        age = (self.start_after_ms if min_age_ms is None else min_age_ms) / 1000
        cutoff = time.perf_counter() - age
        due = [fl for fl in self.runs.by_id.values()
               if fl.phase is NOT_STARTED and not fl.finished and fl.t0 <= cutoff]
        if due:
            await self.record_starts(due)
        return len(due)

    async def record_starts(self, fls: list[Inflight], reclaimed: bool = False,
                            adopted: bool = False) -> None:
        """One start script per partition; moves each run to STARTED (with its token) or
        NOT_OURS, or back to NOT_STARTED if its partition's script failed.  ``reclaimed``: taken
        by XAUTOCLAIM; ``adopted``: taken from the runs of its type set aside (lua/park.lua)."""
        by_part: dict[int, list[Inflight]] = defaultdict(list)
        for fl in fls:
            by_part[fl.partition].append(fl)
        mode = ADOPTED if adopted else RECLAIMED if reclaimed else FRESH
        calls = run_scripts.start(self.link.id, self.settings, by_part, mode,
                                  time.perf_counter())
        for fl in fls:
            fl.phase = STARTING
        reclaimed = reclaimed or adopted
        try:
            results = await self.link.call_many(self.link.r, calls)
        finally:
            for fl in fls:
                fl.phase = NOT_STARTED
        for (p, items), res in zip(by_part.items(), results, strict=True):
            if isinstance(res, Exception):
                log.error("start on partition %d failed: %s", p, res)
                continue
            for fl, (fence, attempt) in zip(items, run_scripts.started(res), strict=True):
                self._took_start(fl, fence, attempt, reclaimed)
        if self.done:
            self.wake.set()  # outcomes held back while their start was under way

    async def expire(self, fl: Inflight) -> bool:
        """Whether lua/expire.lua dead-lettered ``fl`` for its missed start deadline (Redis's
        clock decides); then it must not run."""
        res = await self.link.call_many(
            self.link.r, [run_scripts.expire(fl, self.settings.events_maxlen)])
        if isinstance(res[0], Exception):
            raise res[0]
        return run_scripts.expired(res[0]) == ExpireCode.DEAD_LETTERED

    async def stop_asked(self, fl: Inflight) -> bool:
        """Whether overlap cancelPrevious has asked ``fl`` to stop (its job's record)."""
        return await arun(self.link.r, op_stop_asked(fl.job_key, fl.run_id))

    def _took_start(self, fl: Inflight, fence: int, attempt: int, reclaimed: bool) -> None:
        """One run's start result: a token, or not ours to run (never asked again)."""
        fl.attempt = attempt or fl.attempt
        if fence > 0:
            fl.phase, fl.fence = STARTED, fence
        elif fence == StartFence.FENCED:
            self.refused(fl, "start")
        else:
            fl.phase = NOT_OURS
            if fence == StartFence.NOT_TO_RUN and not reclaimed:
                log.warning("run %s is not this worker's to run (cancelled, finished or "
                            "re-dispatched meanwhile); its outcome will not be recorded",
                            fl.run_id, extra={"job_id": fl.job_id, "run_id": fl.run_id})

    def refused(self, fl: Inflight, what: str) -> None:
        """Redis rejected our start or heartbeat of a run another worker holds now (we stalled
        past the visibility timeout and were reclaimed): count it, say so, never write again."""
        fl.phase = NOT_OURS
        self.metrics.count("fenced", fl.type, fl.queue)
        log.warning("run %s: %s rejected, its stream entry is delivered to another worker now "
                    "(reclaimed while this worker stalled); its outcome will not be recorded",
                    fl.run_id, what, extra={"job_id": fl.job_id, "run_id": fl.run_id})

    def gone(self, fl: Inflight) -> None:
        """The run heartbeat found our run ended or re-dispatched by others (taken over while
        this worker was silent, and finished since): never write for it again."""
        fl.phase = NOT_OURS
        self.metrics.count("fenced", fl.type, fl.queue)
        log.warning("run %s ended elsewhere (taken over while this worker was silent); its "
                    "handler is stopped and its outcome will not be recorded", fl.run_id,
                    extra={"job_id": fl.job_id, "run_id": fl.run_id})

    # --- outcomes ----------------------------------------------------------------------------

    def _take_batch(self) -> list[Outcome]:
        """The outcomes to report now: those whose start is under way wait for its token, and
        those of runs Redis refused to us are dropped (said and counted when it refused)."""
        batch = [o for o in self.done if o.fl.phase is not STARTING]
        if len(batch) == len(self.done):
            self.done = []
        else:
            self.done = [o for o in self.done if o.fl.phase is STARTING]
        if any(o.fl.phase is NOT_OURS for o in batch):
            keep = []
            for o in batch:
                if o.fl.phase is not NOT_OURS:
                    keep.append(o)
                else:
                    self.runs.forget_finished(o.fl)
            batch = keep
        return batch

    async def flush_once(self) -> int:
        """Report finished runs, one complete script per partition (and retention); keep them
        on Redis errors."""
        batch = self._take_batch()
        if not batch:
            return 0
        calls, parts = run_scripts.complete(self.link.id, self.settings, batch,
                                            time.perf_counter())
        # While the read-along is open (one pooled Redis, the stock sender) a report goes raw,
        # at a fraction of redis-py's pipeline's CPU (bench_phases), and may carry the fetch
        # loop's read.
        along = self.read_along
        raw = along.is_open
        read_cmds = along.plan(len(batch)) if raw else None
        read: list[Any] | None = None
        try:
            if not raw:
                results = await self.link.call_many(self.link.r, calls)
            else:
                results, more = await scripts.acall_many_then(
                    self.link.r, calls, read_cmds or [], self.link.held)
                read = more or None
        except UNAVAILABLE as e:
            log.warning("cannot report %d outcomes (%s); will retry", len(batch), e)
            self.done = batch + self.done
            return 0
        finally:
            if read_cmds is not None and read is None:
                along.took(None)
        retry_later: list[Outcome] = []
        for (p, items), res in zip(parts, results, strict=False):
            if isinstance(res, Exception):
                log.error("complete on partition %d failed: %s", p, res)
                retry_later += items
            else:
                self._reported(items, res)
        self.done = retry_later + self.done
        if read is not None:  # after the report: its runs left the table
            along.took(read)
        self.slot.set()
        self.reported.set()
        return len(batch) - len(retry_later)

    def _reported(self, items: list[Outcome], res: list[Any]) -> None:
        """One partition's complete results: count them, forget the runs (per job: inline)."""
        counted: dict[tuple[str, str, str], int] = defaultdict(int)
        by_id, reported = self.runs.by_id, 0
        for o, code in zip(items, res, strict=False):
            code, fl = int(code), o.fl
            if code > 0:  # SUCCEEDED, RETRY or DEAD: the attempt's outcome is recorded
                counted[(o.status, o.type, o.queue)] += 1
            if by_id.pop(fl.run_id, None) is not None:
                reported += 1
            if code == _SUCCEEDED or code == _DUPLICATE:
                continue
            ids = {"job_id": fl.job_id, "run_id": fl.run_id, "attempt": fl.attempt}
            if code == CompleteCode.FENCED:
                self.metrics.count("fenced", o.type, o.queue)
                log.warning("run %s: result rejected, fence %d is stale (run was reclaimed, "
                            "or not this worker's)", fl.run_id, fl.fence, extra=ids)
            elif code == CompleteCode.RETRY:
                self.metrics.count("retried", o.type, o.queue)
            elif code == CompleteCode.DEAD:
                self.metrics.count("dead_lettered", o.type, o.queue)
                log.error("ALERT run %s dead-lettered: %s", fl.run_id,
                          o.text.partition("\n")[0], extra=ids)  # the traceback: in the run
        self.runs.finished -= reported
        for (status, jtype, queue), n in counted.items():
            self.metrics.count(status, jtype, queue, n)
