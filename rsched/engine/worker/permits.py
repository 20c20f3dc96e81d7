"""Queue-wide limits on the worker's side (docs/limits.md, lua/queue_permit.lua): which of its
queues are limited, read again every ``defaults.QUEUE_LIMITS_REFRESH_S``; a permit of the
queue taken before a handler starts, kept alive with each heartbeat and given back when the
handler returns.  A queue without a limit costs nothing per run (a set lookup)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

from rsched.core import defaults
from rsched.engine.worker._link import Link
from rsched.engine.worker.inflight import Inflight
from rsched.rdb.ops import arun
from rsched.rdb.queue_limits import (
    GIVE,
    KEEP,
    TAKE,
    PermitOp,
    op_queue_limits,
    permit_reply,
    queue_permit,
    wake_calls,
)

log = logging.getLogger("rsched.worker")


class Permits:
    """The worker's queue permits: ``limited`` (queues with a limit) and the runs holding one."""

    def __init__(self, link: Link, queues: Sequence[str], ttl_ms: int) -> None:
        self.link = link
        self.queues = frozenset(queues)
        self.ttl_ms = ttl_ms  # a permit not kept for this long expires (the visibility timeout)
        self.limited: frozenset[str] = frozenset()
        self.held: dict[str, Inflight] = {}  # run id -> the run holding a permit

    async def refresh_once(self) -> int:
        """Read which of this worker's queues are limited; how many are."""
        limits = await arun(self.link.r, op_queue_limits())
        self.limited = self.queues & frozenset(limits)
        return len(self.limited)

    async def take(self, fl: Inflight) -> int:
        """A permit for run ``fl`` of a limited queue: 0 if it holds one now, else how many ms
        the run waits before it asks again (it is not run: its queue is at its limit).  Redis
        unreachable: it waits too (a run never starts without a permit)."""
        op = PermitOp(TAKE, fl.run_id, self.link.id, fl.partition)
        try:
            (raw,) = await self.link.call_many(self.link.r, [
                queue_permit(fl.queue, [op], self.ttl_ms)])
            if isinstance(raw, Exception):
                raise raw
            reply = permit_reply(raw, 1)
        except Exception as e:  # noqa: BLE001 - not run without a permit; it asks again
            log.warning("run %s: no permit of queue %s could be taken (%s); it waits",
                        fl.run_id, fl.queue, e, extra={"job_id": fl.job_id, "run_id": fl.run_id})
            return defaults.QUEUE_RECHECK_MS
        await self._wake(reply.wake)
        wait = reply.results[0]
        if wait == 0:
            self.held[fl.run_id] = fl
        return wait

    async def give(self, fl: Inflight) -> None:
        """Give back run ``fl``'s permit, if it holds one (its handler returned); the waiting
        runs it lets start are made due now.  Unreachable: the permit expires by itself."""
        if self.held.pop(fl.run_id, None) is None:
            return
        op = PermitOp(GIVE, fl.run_id, self.link.id, fl.partition)
        try:
            (raw,) = await self.link.call_many(self.link.r, [
                queue_permit(fl.queue, [op], self.ttl_ms)])
            if isinstance(raw, Exception):
                raise raw
            await self._wake(permit_reply(raw, 1).wake)
        except Exception as e:  # noqa: BLE001
            log.warning("run %s: its permit of queue %s could not be given back (%s); it "
                        "expires in %d ms", fl.run_id, fl.queue, e, self.ttl_ms,
                        extra={"job_id": fl.job_id, "run_id": fl.run_id})

    async def keep_once(self) -> int:
        """Keep every held permit alive (the heartbeat); returns how many were found gone (a
        worker that stalled past their expiry: its handlers then run without one)."""
        by_queue: dict[str, list[Inflight]] = defaultdict(list)
        for fl in list(self.held.values()):
            by_queue[fl.queue].append(fl)
        if not by_queue:
            return 0
        calls = [queue_permit(q, [PermitOp(KEEP, fl.run_id, self.link.id, fl.partition)
                                  for fl in fls], self.ttl_ms) for q, fls in by_queue.items()]
        lost = 0
        for fls, raw in zip(by_queue.values(), await self.link.call_many(self.link.r, calls),
                            strict=True):
            if isinstance(raw, Exception):
                continue  # the next beat tries again; the permits last ttl_ms
            for fl, kept in zip(fls, permit_reply(raw, len(fls)).results, strict=True):
                if not kept and self.held.pop(fl.run_id, None) is not None:
                    lost += 1
                    log.warning("run %s lost its permit of queue %s (expired: this worker "
                                "stalled longer than %d ms)", fl.run_id, fl.queue, self.ttl_ms,
                                extra={"job_id": fl.job_id, "run_id": fl.run_id})
        return lost

    async def _wake(self, wake: Sequence[tuple[int, str]]) -> None:
        """Make the waiting runs a reservation was made for due now (a failure leaves them to
        their recheck, and the reservation to its expiry)."""
        if wake:
            try:
                await self.link.call_many(self.link.r, wake_calls(wake))
            except Exception as e:  # noqa: BLE001
                log.warning("waiting runs of a limited queue not woken (%s): their recheck "
                            "brings them", e)
