"""LeaseKeeper: registers the dispatcher, takes its even share of partitions and renews them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import keys, metrics, scripts

log = logging.getLogger("rsched.dispatcher")


@dataclass
class LeaseKeeper:
    """Partition p's preferred owner is live_dispatchers_sorted[p % n]: an even split that every
    dispatcher computes alike, so ownership moves only when the live set changes."""

    r: Any  # redis.asyncio.Redis
    owner: str
    partitions: int
    lease_ms: int = 10_000
    clock: Callable[[], int] | None = None  # injected ms clock (tests); None = Redis TIME
    owned: dict[int, int] = field(default_factory=dict)  # partition -> fence

    async def _now(self) -> int:
        if self.clock:
            return self.clock()
        sec, usec = await self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    async def run_once(self) -> dict[int, int]:
        """One round: register, compute the share, release extras, acquire or renew the share."""
        now = await self._now()
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(keys.dispatchers(), {self.owner: now + self.lease_ms})
        pipe.zremrangebyscore(keys.dispatchers(), "-inf", now)
        pipe.zrange(keys.dispatchers(), 0, -1)
        live = sorted(m.decode() for m in (await pipe.execute())[2])
        idx, n = live.index(self.owner), len(live)
        share = {p for p in range(self.partitions) if p % n == idx}
        now_arg = now if self.clock else 0
        calls: list[scripts.Call] = []
        plan: list[tuple[int, str]] = []
        for p in sorted(set(self.owned) - share):
            calls.append(self._call(p, "release", self.owned[p], now_arg))
            plan.append((p, "release"))
        for p in sorted(share):
            mode = "renew" if p in self.owned else "acquire"
            calls.append(self._call(p, mode, self.owned.get(p, 0), now_arg))
            plan.append((p, mode))
        for (p, mode), res in zip(plan, await scripts.acall_many(self.r, calls), strict=False):
            if isinstance(res, Exception):
                log.warning("lease %s on partition %d failed: %s", mode, p, res)
                continue
            code, fence = int(res[0]), int(res[1])
            if mode == "release" or code != 1:
                if p in self.owned:
                    log.info("partition %d released or lost (fence %d)", p, fence)
                    metrics.LEASE_CHANGES.labels("released" if mode == "release" else "lost").inc()
                self.owned.pop(p, None)
            else:
                if p not in self.owned:
                    log.info("partition %d acquired with fence %d", p, fence)
                    metrics.LEASE_CHANGES.labels("acquired").inc()
                self.owned[p] = fence
        metrics.PARTITIONS_OWNED.set(len(self.owned))
        return dict(self.owned)

    def _call(self, p: int, mode: str, fence: int, now: int) -> scripts.Call:
        return ("lease", [keys.lease(p), keys.stats(p)],
                [self.owner, self.lease_ms, now, mode, fence])

    def lost(self, p: int) -> None:
        """The claim script said our fence is stale: stop using the partition at once."""
        if self.owned.pop(p, None) is not None:
            metrics.LEASE_CHANGES.labels("lost").inc()
            log.warning("partition %d: lease lost (stale fence), stopping its dispatch", p)

    async def release_all(self) -> None:
        now_arg = (await self._now()) if self.clock else 0
        calls = [self._call(p, "release", f, now_arg) for p, f in self.owned.items()]
        await scripts.acall_many(self.r, calls)
        await self.r.zrem(keys.dispatchers(), self.owner)
        self.owned.clear()
