"""A worker's membership: its consumer in every group, its heartbeat (its runs' stream entries
and its registry entry), pruning consumers of killed workers, and leaving."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass, field

import msgpack

from rsched.core import defaults
from rsched.core.codes import HeartbeatCode
from rsched.core.settings import Settings
from rsched.core.views import forgotten, worker_record
from rsched.core.wire import as_text
from rsched.engine.worker._link import Link
from rsched.engine.worker.inflight import STARTED, Inflight, Runs, request_stop
from rsched.engine.worker.reporter import Reporter
from rsched.obs.metrics import RunMetrics
from rsched.rdb import run_scripts, worker_registry, worker_streams

log = logging.getLogger("rsched.worker")


@dataclass(slots=True)
class Membership:
    """Keeps this worker known as alive, and its live runs as its own."""

    link: Link
    settings: Settings
    runs: Runs
    reporter: Reporter
    metrics: RunMetrics
    queues: list[str]
    concurrency: int
    types: list[str]  # the job types it has handlers for, so the CLI can warn of a missing one
    handler_wait_ms: int  # how long runs of a type no live worker serves wait (the CLI says it)
    heartbeat_ms: int = defaults.HEARTBEAT_MS  # in its record: readers judge its silence by it
    dead_after_ms: int = defaults.DEAD_AFTER_MS  # in its record: ... by its process heartbeat
    started_added: dict[int, int] = field(default_factory=dict)  # started_in, as added to Redis
    lag_added: list[float] = field(default_factory=list)  # metrics.lag.total(), as added to Redis

    async def join(self) -> None:
        """Create the consumer group of every stream (an existing one is fine)."""
        await worker_streams.join_groups(self.link.r, list(self.link.streams))

    async def heartbeat_once(self, progress_only: bool = False) -> int:
        """Refresh every in-flight run's entry, with the progress its handler reported since
        the last beat; returns how many runs were found lost.  ``progress_only``: only the runs
        with new progress (ProgressSender, between beats).

        Runs whose start is not recorded yet get it first, whatever their age."""
        if not progress_only:
            await self.reporter.start_once(min_age_ms=0)
        by_part: dict[int, list[tuple[Inflight, str]]] = defaultdict(list)
        for fl in list(self.runs.by_id.values()):
            if fl.phase is STARTED and (fl.progress_new or not progress_only):
                by_part[fl.partition].append((fl, fl.progress if fl.progress_new else ""))
                fl.progress_new = False
        if progress_only and not by_part:
            return 0
        calls = run_scripts.heartbeat(self.link.id, self.settings.events_maxlen, by_part)
        lost = 0
        results = await self.link.call_many(self.link.r, calls)
        for items, res in zip(by_part.values(), results, strict=True):
            if isinstance(res, Exception):
                for fl, progress in items:  # not sent: with the next beat, unless newer came
                    fl.progress_new = fl.progress_new or progress != ""
                continue
            for (fl, _), code in zip(items, run_scripts.heartbeat_codes(res), strict=False):
                if code == HeartbeatCode.FENCED and fl.phase is STARTED:
                    self.reporter.refused(fl, "heartbeat")
                    request_stop(fl)  # another worker runs it now: stop ours, report nothing
                elif code == HeartbeatCode.GONE and fl.phase is STARTED and not fl.finished:
                    self.reporter.gone(fl)
                    request_stop(fl)
                if code == HeartbeatCode.STOP:
                    if request_stop(fl):
                        log.info("run %s asked to stop: overlap cancelPrevious, a later "
                                 "occurrence replaces it", fl.run_id,
                                 extra={"job_id": fl.job_id, "run_id": fl.run_id})
                elif code != HeartbeatCode.OURS and fl.run_id in self.runs:
                    lost += 1
        if not progress_only:
            await self._register()
        return lost

    async def _register(self) -> None:
        """This worker's registry entry, for the CLI, the dashboard and the cluster metrics,
        and the runs it started since the last beat, added to each partition's ``started``
        count, and their start lags, added to the cluster's histogram (cluster-wide totals that
        do not drop when the worker dies)."""
        record = msgpack.packb({
            "queues": self.queues, "inflight": len(self.runs), "pid": os.getpid(),
            "host": socket.gethostname(), "beat_ms": int(time.time() * 1000),
            "concurrency": self.concurrency, "types": self.types,
            "heartbeat_ms": self.heartbeat_ms, "dead_after_ms": self.dead_after_ms,
            "handler_wait_ms": self.handler_wait_ms,
            "metrics": self.metrics.heartbeat(),
        })
        now = dict(self.metrics.started_in)
        added = {p: n - self.started_added.get(p, 0) for p, n in now.items()
                 if n > self.started_added.get(p, 0)}
        lag = self.metrics.lag.total()
        base = self.lag_added or [0.0] * len(lag)
        new_lag = [n - b for n, b in zip(lag, base, strict=True)]
        parts, lagged = await worker_registry.register(self.link.r, self.link.id, record, added,
                                                       new_lag)
        for p in parts:
            self.started_added[p] = now[p]  # the others: added at the next beat
        if lagged:
            self.lag_added = lag  # else added at the next beat

    async def prune_consumers_once(self, idle_ms: int = defaults.CONSUMER_IDLE_MS) -> int:
        """Delete consumers of killed workers: idle for ``idle_ms`` with nothing pending; and
        the registry records of workers dead for longer than WORKER_FORGET_MS.

        A consumer with pending entries is kept (XAUTOCLAIM moves its runs first); a live
        worker reads every half second, and a deleted live consumer is recreated by its next read.
        """
        await self._forget_dead()
        return await worker_streams.prune_consumers(self.link.r, list(self.link.streams),
                                                    self.link.id, idle_ms)

    async def _forget_dead(self) -> None:
        r, now = self.link.r, int(time.time() * 1000)
        records = await worker_registry.records(r)
        gone = [wid for wid, blob in records.items() if as_text(wid) != self.link.id
                and forgotten(worker_record(blob), now)]
        if gone:
            await worker_registry.forget(r, gone)
            log.info("forgot %d workers dead for over %d s", len(gone),
                     defaults.WORKER_FORGET_MS // 1000)

    async def leave(self) -> None:
        """Leave the registry and the consumer groups, except where entries still wait for
        reclaim under our name (deleting the consumer would drop them from the group): those
        are marked dead at once for live workers to take over."""
        r, me = self.link.r, self.link.id
        await worker_registry.forget(r, [me])
        if await worker_streams.leave_groups(r, list(self.link.streams), me):
            await worker_registry.mark_dead(r, me)  # live workers take them over at once
        else:
            await worker_registry.forget_alive(r, [me])
