"""The dispatcher process: lease keeping and claiming, sleeping until the next due time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rsched.core import defaults
from rsched.core.ids import process_id
from rsched.core.settings import Settings
from rsched.engine import aio
from rsched.engine._calls import CallMany
from rsched.engine.dispatcher.claimer import FULL_READ_S, Claimer, ClaimResult
from rsched.engine.dispatcher.leases import LeaseKeeper
from rsched.engine.dispatcher.trimmer import StreamTrimmer, TrimResult
from rsched.obs import metrics
from rsched.rdb import scripts
from rsched.rdb.connect import connect_async
from rsched.rdb.redis_api import AsyncRedis
from rsched.rdb.setup import (
    Outage,
    acheck_redis,
    aensure_partitions,
    is_unavailable,
    wait_for_redis,
)
from rsched.rdb.shared_keys import wake_messages

log = logging.getLogger("rsched.dispatcher")

class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        *,
        dispatcher_id: str | None = None,
        lease_ms: int = defaults.LEASE_MS,
        batch: int = defaults.CLAIM_BATCH,
        max_sleep_ms: int = defaults.MAX_SLEEP_MS,
        clock: Callable[[], int] | None = None,
        full_read_s: float = FULL_READ_S,
        call_many: CallMany = scripts.acall_many,
        trim_every_ms: int = defaults.EVENTS_TRIM_EVERY_MS,
    ) -> None:
        self.settings = settings
        self.id = dispatcher_id or process_id("d")
        self.lease_ms = lease_ms
        self.batch = batch
        self.max_sleep_ms = max_sleep_ms
        self.clock = clock
        self.full_read_s = full_read_s  # see Claimer.full_read_s
        self.call_many = call_many  # how the lease and claim scripts are sent
        self.trim_every_ms = trim_every_ms  # how often the owned events streams are trimmed
        self.r: AsyncRedis = connect_async(settings.redis_url, wait=settings.wait_replicas,
                                       wait_timeout_ms=settings.wait_timeout_ms)
        self._wake = asyncio.Event()
        self.leases: LeaseKeeper | None = None
        self.claimer: Claimer | None = None
        self.trimmer = StreamTrimmer(self.r, settings.events_keep, settings.events_keep_ms,
                                    clock, call_many=call_many)
        metrics.export_dispatching()

    async def setup(self) -> None:
        await acheck_redis(self.r, self.settings.allow_unsafe_redis)
        p = await aensure_partitions(self.r, self.settings.initial_partitions,
                                     self.settings.strict_partitions)
        self.leases = LeaseKeeper(self.r, self.id, p, self.lease_ms, self.clock,
                                  call_many=self.call_many)
        self.claimer = Claimer(self.r, self.id, self.batch, self.settings.events_maxlen,
                               self.clock, full_read_s=self.full_read_s,
                               call_many=self.call_many, run_ttl_ms=self.settings.run_ttl_ms,
                               history_len=self.settings.history_len)

    async def claim_once(self, *, skip_idle: bool = False) -> ClaimResult:
        """One claim round (see Claimer.run_once; the loop below skips idle partitions)."""
        assert self.leases and self.claimer
        t0 = time.perf_counter()
        res = await self.claimer.run_once(self.leases.owned, skip_idle=skip_idle)
        metrics.CLAIM_ROUND.observe(time.perf_counter() - t0)
        if res.dispatched:
            metrics.DISPATCHED.inc(res.dispatched)
        if res.skipped:
            metrics.SKIPPED.inc(res.skipped)
        for p in res.lost:
            self.leases.lost(p)
        return res

    async def trim_once(self) -> TrimResult:
        """Trim the events streams of the owned partitions (see StreamTrimmer)."""
        assert self.leases
        return await self.trimmer.run_once(self.leases.owned)

    async def _trim(self) -> None:
        """trim_once, off the claim's path: a failed trim is tried again next time, and never
        holds up a claim round (Redis down: the claim round says so)."""
        try:
            await self.trim_once()
        except Exception as e:  # noqa: BLE001 - the next round trims what this one did not
            if not is_unavailable(e):
                log.warning("trimming the streams failed: %s", e)

    async def _listen(self) -> None:
        """Wake the loop when a client schedules a job earlier than anything we knew of."""
        while True:
            try:
                async for partition in wake_messages(self.r):
                    if self.claimer is not None:
                        self.claimer.forget(partition)
                    self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep listening through Redis restarts
                log.warning("wake listener: %s; retrying", e)
                await asyncio.sleep(0.5)

    async def run(self, stop: asyncio.Event) -> None:
        if not await wait_for_redis(self.setup, self.settings.redis_url, stop):
            await self.r.aclose()  # stopped before Redis came up
            return
        assert self.leases
        listener = asyncio.create_task(self._listen())
        renew_every = self.leases.renew_every_ms / 1000
        next_renew = next_trim = 0.0
        log.info("dispatcher %s started", self.id)
        outage = Outage(log)
        try:
            while not stop.is_set():
                try:
                    if time.monotonic() >= next_renew:
                        t_lease = time.monotonic()
                        await self.leases.run_once()
                        next_renew = time.monotonic() + renew_every
                        orphan_ms = self.leases.orphan_expiry_in_ms
                        if orphan_ms is not None:  # a dead member's lease runs out: take it then
                            next_renew = min(next_renew, t_lease + orphan_ms / 1000 + 0.005)
                    if time.monotonic() >= next_trim:
                        next_trim = time.monotonic() + self.trim_every_ms / 1000
                        await self._trim()
                    self._wake.clear()
                    t0 = time.monotonic()
                    res = await self.claim_once(skip_idle=True)
                except Exception as e:  # noqa: BLE001 - keep the process alive
                    if stop.is_set():
                        break
                    if is_unavailable(e):
                        outage.down(e)
                    else:
                        log.exception("dispatch round failed: %s", e)  # a bug: log loudly
                    await asyncio.sleep(0.5)
                    continue
                outage.up()
                if res.full:
                    continue
                sleep_s = min(self.max_sleep_ms / 1000, max(next_renew - time.monotonic(), 0))
                if res.earliest_ms is not None and res.now_ms is not None:
                    now = res.now_ms + int((time.monotonic() - t0) * 1000)
                    sleep_s = min(sleep_s, max(res.earliest_ms - now, 0) / 1000)
                if sleep_s > 0:
                    await self._sleep(stop, sleep_s)
        finally:
            listener.cancel()
            try:
                await self.leases.release_all()
            except Exception as e:  # noqa: BLE001
                log.warning("could not release leases: %s", e)
            await self.r.aclose()
            log.info("dispatcher %s stopped", self.id)

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


def serve(settings: Settings, **options: Any) -> None:
    """Run a dispatcher until SIGINT/SIGTERM."""
    import signal

    async def main() -> None:
        aio.tune_gc()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await Dispatcher(settings, **options).run(stop)

    aio.run(main())
