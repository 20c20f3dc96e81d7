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
from functools import cache
from typing import Any, Protocol

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
from rsched.obs.metrics import RunMetrics
from rsched.rdb import keys, scripts
from rsched.rdb.setup import UNAVAILABLE

log = logging.getLogger("rsched.worker")

# Compared per reported run: plain ints, which save an attribute lookup on the enum class and
# the subclass check an int == IntEnum comparison makes.
_SUCCEEDED, _DUPLICATE = int(CompleteCode.SUCCEEDED), int(CompleteCode.DUPLICATE)


@cache
def _call_keys(p: int) -> tuple[str, ...]:
    """complete.lua's partition keys, built once per partition."""
    return keys.events(p), keys.stats(p), keys.retry(p), keys.dead(p)


class Tail(Protocol):
    """The intake's side of a read sent with a report (Intake.plan_with_report)."""

    def plan_with_report(self, freed: int) -> Any: ...
    def read_commands(self, plan: Any) -> list[tuple[Any, ...]]: ...
    def took_with_report(self, plan: Any, resps: list[Any] | None) -> int: ...


class Reporter:
    """Starts and outcomes of this worker's runs, batched per partition."""

    def __init__(self, link: Link, settings: Settings, runs: Runs, metrics: RunMetrics,
                 slot: asyncio.Event, start_after_ms: int) -> None:
        self.link = link
        self.settings = settings
        self.runs = runs
        self.metrics = metrics
        self.slot = slot  # set when a report frees slots for new runs
        self.start_after_ms = start_after_ms
        self.done: list[Outcome] = []  # outcomes waiting for their report
        self.wake = asyncio.Event()  # set when there may be something to report
        self.tail: Tail | None = None  # the intake, when reads may go with reports
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
        calls = self._start_calls(by_part, 2 if adopted else int(reclaimed))
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
            for i, fl in enumerate(items):
                self._took_start(fl, int(res[2 * i]), int(res[2 * i + 1]), reclaimed)
        if self.done:
            self.wake.set()  # outcomes held back while their start was under way

    def _start_calls(self, by_part: dict[int, list[Inflight]], mode: int
                     ) -> list[scripts.Call]:
        """start.lua's calls (its header has the layout; ``mode``: its 'reclaimed' value);
        marks each run STARTING."""
        s, now = self.settings, time.perf_counter()
        calls: list[scripts.Call] = []
        for p, items in by_part.items():
            ks = [keys.events(p), keys.stats(p), keys.dead(p), keys.retry(p)]
            args: list[Any] = [self.link.id, 0, s.events_maxlen, keys.GROUP, len(items),
                               s.history_len, keys.PARKED_CONSUMER]
            for fl in items:
                ks += [fl.run_key, fl.job_key, fl.stream, keys.history(p, fl.job_id)]
                args += [fl.run_id, fl.entry_id, int((now - fl.t0) * 1000), mode]
                fl.phase = STARTING
            calls.append(("start", ks, args))
        return calls

    async def expire(self, fl: Inflight) -> bool:
        """Whether lua/expire.lua dead-lettered ``fl`` for its missed start deadline (Redis's
        clock decides); then it must not run."""
        p = fl.partition
        s = self.settings
        res = await self.link.call_many(self.link.r, [(
            "expire", [fl.run_key, fl.job_key, fl.stream, keys.dead(p), keys.events(p),
                       keys.stats(p)],
            [fl.run_id, fl.entry_id, 0, s.events_maxlen, keys.GROUP])])
        if isinstance(res[0], Exception):
            raise res[0]
        return int(res[0]) == ExpireCode.DEAD_LETTERED

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
        """Report finished runs, one complete script per partition; keep them on Redis errors."""
        batch = self._take_batch()
        if not batch:
            return 0
        calls, parts = self._complete_calls(batch)
        # A read goes along only through the stock sender (an injected one sees scripts alone).
        # With the intake as tail (one pooled Redis), a report without a read goes the same raw
        # way, at a fraction of redis-py's pipeline's CPU (bench_phases; at concurrency 100 every
        # report goes alone).
        tail = self.tail if self.link.call_many is scripts.acall_many else None
        plan = tail.plan_with_report(len(batch)) if tail is not None else None
        read: list[Any] | None = None
        try:
            if tail is None:
                results = await self.link.call_many(self.link.r, calls)
            else:
                results, more = await scripts.acall_many_then(
                    self.link.r, calls, [] if plan is None else tail.read_commands(plan),
                    self.link.held)
                read = more or None
        except UNAVAILABLE as e:
            log.warning("cannot report %d outcomes (%s); will retry", len(batch), e)
            self.done = batch + self.done
            return 0
        finally:
            if tail is not None and plan is not None and read is None:
                tail.took_with_report(plan, None)
        retry_later: list[Outcome] = []
        for (p, items), res in zip(parts.items(), results, strict=False):
            if isinstance(res, Exception):
                log.error("complete on partition %d failed: %s", p, res)
                retry_later += items
            else:
                self._reported(items, res)
        self.done = retry_later + self.done
        if tail is not None and read is not None:  # after the report: its runs left the table
            tail.took_with_report(plan, read)
        self.slot.set()
        self.reported.set()
        return len(batch) - len(retry_later)

    def _complete_calls(self, batch: list[Outcome]
                        ) -> tuple[list[scripts.Call], dict[int, list[Outcome]]]:
        """complete.lua's calls, one per partition (its header has the layout), and each call's
        outcomes in the order of its replies.  A run not STARTED goes with fence 0, and the
        script records its start with its outcome.  Runs are grouped by stream and by kind, so
        the stream key goes once per group and a one-off job's own run needs only its job key
        (its run and history live there), and a group whose runs all succeeded leaves out
        their outcome and retry delay: 7 arguments a run instead of 12."""
        by_part: dict[int, dict[tuple[str, bool], list[Outcome]]] = defaultdict(
            lambda: defaultdict(list))
        for o in batch:
            fl = o.fl
            by_part[fl.partition][(fl.stream, fl.run_key == fl.job_key)].append(o)
        s, now = self.settings, time.perf_counter()
        calls: list[scripts.Call] = []
        parts: dict[int, list[Outcome]] = {}
        for p, groups in by_part.items():
            ks = list(_call_keys(p))
            args: list[Any] = [self.link.id, 0, s.events_maxlen, keys.GROUP, len(groups),
                               s.history_len, s.run_ttl_ms, s.finished_ttl_ms]
            run_ks: list[str] = []
            run_args: list[Any] = []
            parts[p] = ordered = []
            for (stream, own), items in groups.items():
                ks.append(stream)
                ok = all(o.status == "succeeded" for o in items)
                args += [len(items), ("1" if own else "0") + ("s" if ok else "")]
                for o in items:
                    fl = o.fl
                    if own:
                        run_ks.append(fl.job_key)
                    else:
                        run_ks += [fl.run_key, fl.job_key, keys.history(p, fl.job_id)]
                    run_args += [fl.run_id, fl.fence, o.duration_ms, o.text, fl.entry_id,
                                 int((now - fl.t0) * 1000)]
                    if not ok:
                        run_args += [o.status, o.delay_ms]
                ordered += items
            calls.append(("complete", ks + run_ks, args + run_args))
        return calls, parts

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
