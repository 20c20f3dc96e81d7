"""The worker's background loops: each calls one part's ``run_once`` and only loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rsched.engine.worker.reporter import Reporter
from rsched.engine.worker.runner import Runner
from rsched.rdb.setup import Outage, is_unavailable

log = logging.getLogger("rsched.worker")

FLUSHES_IN_FLIGHT = 4
IDLE_AFTER_FAILED_FLUSH_S = 0.2  # nothing got through (Redis away): don't spin


class Every:
    """Calls ``run_once`` every ``every_s`` until stopped; a round that fails is logged and the
    loop goes on (a loop must survive Redis hiccups).  With ``outage``, its rounds also tell
    when Redis went away and came back."""

    def __init__(self, run_once: Callable[[], Awaitable[Any]], every_s: float,
                 outage: Outage | None = None) -> None:
        self.run_once = run_once
        self.every_s = every_s
        self.outage = outage

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as e:  # noqa: BLE001 - a loop must survive Redis hiccups
                log.warning("%s: %s", getattr(self.run_once, "__name__", "loop"), e)
                if self.outage is not None and is_unavailable(e):
                    self.outage.down(e, logged=True)
            else:
                if self.outage is not None:
                    self.outage.up()
            try:
                await asyncio.wait_for(stop.wait(), self.every_s)
            except TimeoutError:
                pass


class Flusher:
    """Reports outcomes up to flush_ms after the first is waiting, so that outcomes of handlers
    still running go in the same report; at once when none is running (nothing to wait for:
    at concurrency 16 a whole batch of short runs ends within a fraction of flush_ms, and the
    wait was most of each round: the peer benchmark, docs/performance.md).  The price,
    at concurrency 1000, is slightly smaller reports (runs read during the wait no longer
    join).  Up to FLUSHES_IN_FLIGHT reports at once: a report waits its turn behind other
    clients' scripts in Redis, and the handlers should not."""

    def __init__(self, reporter: Reporter, runner: Runner, flush_ms: float) -> None:
        self.reporter = reporter
        self.runner = runner
        self.flush_ms = flush_ms

    async def run_once(self) -> int:
        """One report; returns how many outcomes got through."""
        rep, n = self.reporter, 0
        try:
            n = await rep.flush_once()
            if not n and rep.done:
                await asyncio.sleep(IDLE_AFTER_FAILED_FLUSH_S)
        except Exception as e:  # noqa: BLE001
            log.warning("flush: %s", e)
            await asyncio.sleep(IDLE_AFTER_FAILED_FLUSH_S)
        if rep.done:
            rep.wake.set()
        return n

    async def run(self, stop: asyncio.Event) -> None:
        """Until stopped with nothing left running or to report."""
        rep, slots = self.reporter, asyncio.Semaphore(FLUSHES_IN_FLIGHT)
        reports: set[asyncio.Task[None]] = set()

        async def report() -> None:
            try:
                await self.run_once()
            finally:
                slots.release()

        while not (stop.is_set() and not rep.done and not self.runner.tasks):
            await rep.wake.wait()
            rep.wake.clear()
            runs = self.runner.runs
            if runs.finished < len(runs.by_id):  # a handler still runs: wait for it a while
                rep.settled.clear()
                try:
                    async with asyncio.timeout(self.flush_ms / 1000):
                        await rep.settled.wait()
                except TimeoutError:
                    pass
            await slots.acquire()
            if not rep.done:  # what woke this round went with a report started since
                slots.release()
                continue
            task = asyncio.create_task(report())
            reports.add(task)
            task.add_done_callback(reports.discard)
        if reports:
            await asyncio.wait(reports)
