"""A worker's membership: its consumer in every group, its heartbeat (its runs' stream entries
and its registry entry), pruning consumers of killed workers, and leaving."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from rsched.core import defaults
from rsched.core.codes import HeartbeatCode
from rsched.core.settings import Settings
from rsched.core.views import forgotten, worker_record
from rsched.core.wire import as_text
from rsched.engine.worker._link import Link
from rsched.engine.worker.inflight import STARTED, Inflight, Runs, request_stop
from rsched.engine.worker.reporter import Reporter
from rsched.obs.metrics import RunMetrics
from rsched.rdb import keys, scripts

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
    started_added: dict[int, int] = field(default_factory=dict)  # started_in, as added to Redis

    async def join(self) -> None:
        """Create the consumer group of every stream (an existing one is fine)."""
        pipe = self.link.r.pipeline(transaction=False)
        for s in self.link.streams:
            pipe.xgroup_create(s, keys.GROUP, id="0", mkstream=True)
        for res in await pipe.execute(raise_on_error=False):
            if isinstance(res, ResponseError) and "BUSYGROUP" not in str(res):
                raise res

    async def heartbeat_once(self) -> int:
        """Refresh every in-flight run's entry; returns how many runs were found lost.

        Runs whose start is not recorded yet get it first, whatever their age."""
        await self.reporter.start_once(min_age_ms=0)
        by_part: dict[int, list[Inflight]] = defaultdict(list)
        for fl in list(self.runs.by_id.values()):
            if fl.phase is STARTED:
                by_part[fl.partition].append(fl)
        calls: list[scripts.Call] = []
        for p, items in by_part.items():
            ks: list[str] = [keys.events(p), keys.stats(p)]
            args: list[Any] = [self.link.id, 0, keys.GROUP, len(items),
                               self.settings.events_maxlen]
            for fl in items:
                ks += [fl.run_key, fl.job_key, fl.stream]
                args += [fl.run_id, fl.fence, fl.entry_id]
            calls.append(("heartbeat", ks, args))
        lost = 0
        results = await self.link.call_many(self.link.r, calls)
        for items, res in zip(by_part.values(), results, strict=True):
            if isinstance(res, Exception):
                continue
            for fl, code in zip(items, res, strict=False):
                if int(code) == HeartbeatCode.FENCED and fl.phase is STARTED:
                    self.reporter.refused(fl, "heartbeat")
                if int(code) == HeartbeatCode.STOP:
                    if request_stop(fl):
                        log.info("run %s asked to stop: overlap cancelPrevious, a later "
                                 "occurrence replaces it", fl.run_id,
                                 extra={"job_id": fl.job_id, "run_id": fl.run_id})
                elif int(code) != HeartbeatCode.OURS and fl.run_id in self.runs:
                    lost += 1
        await self._register()
        return lost

    async def _register(self) -> None:
        """This worker's registry entry, for the CLI, the dashboard and the cluster metrics,
        and the runs it started since the last beat, added to each partition's ``started``
        count (a cluster-wide total that does not drop when the worker dies)."""
        pipe = self.link.r.pipeline(transaction=False)  # keys in different slots
        pipe.hset(keys.workers(), self.link.id, msgpack.packb({
            "queues": self.queues, "inflight": len(self.runs), "pid": os.getpid(),
            "host": socket.gethostname(), "beat_ms": int(time.time() * 1000),
            "concurrency": self.concurrency, "types": self.types,
            "heartbeat_ms": self.heartbeat_ms,
            "handler_wait_ms": self.handler_wait_ms,
            "metrics": self.metrics.heartbeat(),
        }))
        now = dict(self.metrics.started_in)
        parts = [p for p, n in now.items() if n > self.started_added.get(p, 0)]
        for p in parts:
            pipe.hincrby(keys.stats(p), "started", now[p] - self.started_added.get(p, 0))
        registered, *added = await pipe.execute(raise_on_error=False)
        if isinstance(registered, Exception):
            raise registered
        for p, res in zip(parts, added, strict=True):
            if not isinstance(res, Exception):  # else added at the next beat
                self.started_added[p] = now[p]

    async def prune_consumers_once(self, idle_ms: int = defaults.CONSUMER_IDLE_MS) -> int:
        """Delete consumers of killed workers: idle for ``idle_ms`` with nothing pending; and
        the registry records of workers dead for longer than WORKER_FORGET_MS.

        A consumer with pending entries is kept (XAUTOCLAIM moves its runs first); a live
        worker reads every half second, and a deleted live consumer is recreated by its next read.
        """
        r, names = self.link.r, list(self.link.streams)
        await self._forget_dead()
        pipe = r.pipeline(transaction=False)
        for s in names:
            pipe.xinfo_consumers(s, keys.GROUP)
        pipe2 = r.pipeline(transaction=False)
        doomed = 0
        for s, consumers in zip(names, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(consumers, Exception):
                continue
            for c in consumers:
                name = as_text(c["name"])
                if name != self.link.id and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                    pipe2.xgroup_delconsumer(s, keys.GROUP, name)
                    doomed += 1
        if doomed:
            await pipe2.execute(raise_on_error=False)
        return doomed

    async def _forget_dead(self) -> None:
        r, now = self.link.r, int(time.time() * 1000)
        records = await r.hgetall(keys.workers())
        gone = [wid for wid, blob in records.items() if as_text(wid) != self.link.id
                and forgotten(worker_record(blob), now)]
        if gone:
            await r.hdel(keys.workers(), *gone)
            log.info("forgot %d workers dead for over %d s", len(gone),
                     defaults.WORKER_FORGET_MS // 1000)

    async def leave(self) -> None:
        """Leave the registry and the consumer groups, except where entries still wait for
        reclaim under our name (deleting the consumer would drop them from the group)."""
        r, me, names = self.link.r, self.link.id, list(self.link.streams)
        await r.hdel(keys.workers(), me)
        pipe = r.pipeline(transaction=False)
        for s in names:
            pipe.xpending_range(s, keys.GROUP, "-", "+", 1, consumername=me)
        mine = await pipe.execute(raise_on_error=False)
        pipe = r.pipeline(transaction=False)
        for s, pending in zip(names, mine, strict=False):
            if isinstance(pending, list) and not pending:
                pipe.xgroup_delconsumer(s, keys.GROUP, me)
        await pipe.execute(raise_on_error=False)
