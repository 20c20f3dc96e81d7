"""LeaseKeeper: registers the dispatcher, takes its even share of partitions and renews them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from rsched.core import defaults
from rsched.core.codes import LeaseCode
from rsched.engine._calls import CallMany
from rsched.obs import metrics
from rsched.rdb import leases, scripts
from rsched.rdb.setup import is_unavailable

log = logging.getLogger("rsched.dispatcher")


@dataclass(frozen=True, slots=True)
class LeaseView:
    """One partition's lease as a round reads it."""

    owner: str  # '' when free (released or expired)
    offer: str = ""  # the member its owner offers it to
    free_since_ms: int = 0  # when a free lease expired or was released (0: never leased)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one dispatcher does with the leases in one round."""

    keep: dict[int, str]  # partition it holds -> member to offer it to ('' = keep it)
    take: list[int]  # free partitions and partitions offered to it, to acquire


def plan_round(me: str, live: Collection[str], leases: Sequence[LeaseView],
               mine: Collection[int], now_ms: int, free_grace_ms: int) -> Plan:
    """Share the partitions out evenly among the live members, moving as few as possible.

    Each member keeps what it holds up to its target (P // n, one more for the P % n members
    holding most). Free partitions go to the members short of their target, in name order. The
    shortfall left after them and after the leases of members no longer live (free once those
    run out) is covered by offers from members over their target. An offer goes to a live member
    only and moves nothing until that member takes it over; the owner renews until then, so
    rebalancing leaves no partition unowned. Every member computes the same plan from the same
    leases, and a partition free for `free_grace_ms` is anybody's (its planned taker died)."""
    members = sorted({*live, me})
    held: dict[str, list[int]] = {m: [] for m in members}
    free: list[int] = []
    gone = 0  # held by members no longer live
    for p, lease in enumerate(leases):
        owner = me if p in mine and lease.owner == "" else lease.owner  # expired, renewable
        if owner == "":
            free.append(p)
        elif owner in held:
            held[owner].append(p)
        else:
            gone += 1
    base, extra = divmod(len(leases), len(members))
    ranked = sorted(members, key=lambda m: (-len(held[m]), m))
    target = {m: base + (i < extra) for i, m in enumerate(ranked)}
    short = [m for m in members for _ in range(target[m] - len(held[m]))]  # a slot per lack
    take = [p for p, m in zip(free, short, strict=False) if m == me]
    take += [p for p in free if 0 < leases[p].free_since_ms <= now_ms - free_grace_ms]
    unfilled = short[len(free):]  # slots left for the leases of gone members, then offers
    take += [p for p, lease in enumerate(leases) if lease.offer == me][:unfilled.count(me)]
    take += [p for p in held[me] if p not in mine]  # ours by the lease, unknown to us
    excess = [p for m in members for p in held[m][target[m]:]]
    offers = dict(zip(excess, unfilled[gone:], strict=False))
    return Plan({p: offers.get(p, "") for p in held[me] if p in mine}, sorted(set(take)))


@dataclass
class LeaseKeeper:
    """Renews every `lease_ms` / 4 (a pause of up to three rounds keeps the leases); a member
    is live while it has registered within three renewals, so a dead one drops out before its
    leases expire and whoever takes them over sees the right share.  A round that sees a lease
    of a member no longer live asks for the next round right at that lease's expiry
    (``orphan_expiry_in_ms``): its partitions are taken over then, not up to a round later."""

    r: Any  # redis.asyncio.Redis
    owner: str
    partitions: int
    lease_ms: int = defaults.LEASE_MS
    clock: Callable[[], int] | None = None  # injected ms clock (tests); None = Redis TIME
    call_many: CallMany = scripts.acall_many  # how the lease scripts are sent
    owned: dict[int, int] = field(default_factory=dict)  # partition -> fence
    offered: dict[int, str] = field(default_factory=dict)  # partition -> member offered to
    # ms from the last round's start until the earliest lease of a member no longer live
    # expires (None: no such lease)
    orphan_expiry_in_ms: int | None = None

    @property
    def renew_every_ms(self) -> int:
        return self.lease_ms // 4

    @property
    def member_ttl_ms(self) -> int:
        return self.lease_ms - self.renew_every_ms

    async def _now(self) -> int:
        return self.clock() if self.clock else await leases.redis_time_ms(self.r)

    async def read(self, now: int) -> tuple[list[str], list[LeaseView]] | None:
        """The live members and every partition's lease; None when part of it could not be
        read (a cluster master is down): the round then only renews what it holds, since a
        plan from a partial picture could take what a live member holds."""
        seen = await leases.read_leases(self.r, self.partitions, now)
        if seen.failed:
            if len(seen.failed) == seen.sent:
                raise seen.failed[0]  # nothing answered: Redis is away
            log.warning("leases: %d of %d reads failed (%s); renewing only", len(seen.failed),
                        seen.sent, seen.failed[0])
            return None
        views = []
        live = {*seen.members, self.owner}
        orphaned = []  # expiries of leases whose owner is no longer a live member
        for owner, expires_ms, offer in seen.leases:
            held = bool(owner) and expires_ms > now
            views.append(LeaseView(owner if held else "", offer if held else "",
                                   0 if held else expires_ms))
            if held and owner not in live:
                orphaned.append(expires_ms)
        self.orphan_expiry_in_ms = min(orphaned) - now if orphaned else None
        return seen.members, views

    async def run_once(self) -> dict[int, int]:
        """One round: plan, renew (offering the excess), take what the plan gives, register.

        Registering last, with the round's start time, keeps a member's entry from outliving
        the leases it renewed: a member that dies mid-round has registered no later."""
        now = await self._now()
        seen = await self.read(now)
        plan = (Plan(dict.fromkeys(self.owned, ""), []) if seen is None else
                plan_round(self.owner, *seen, self.owned, now, self.renew_every_ms))
        now_arg = now if self.clock else 0
        calls: list[scripts.Call] = []
        plan_ps: list[tuple[int, str]] = []
        for p in sorted(self.owned):
            to = plan.keep.get(p, "")
            calls.append(self._call(p, leases.RENEW, self.owned[p], now_arg, to))
            plan_ps.append((p, to))
        for p in plan.take:
            calls.append(self._call(p, leases.ACQUIRE, 0, now_arg))
            plan_ps.append((p, ""))
        for (p, to), res in zip(plan_ps, await self.call_many(self.r, calls), strict=True):
            if isinstance(res, Exception):
                log.warning("lease on partition %d failed: %s", p, res)
                continue
            code, fence = leases.LeaseReply.of(res)
            if code != LeaseCode.HELD:
                if p in self.owned:
                    self.lost(p, quiet=True)
                continue
            if p not in self.owned:
                log.info("partition %d acquired with fence %d", p, fence)
                metrics.LEASE_CHANGES.labels("acquired").inc()
            self.owned[p] = fence
            if to and self.offered.get(p) != to:
                log.info("partition %d offered to %s", p, to)
            self.offered[p] = to
        try:
            await leases.register(self.r, self.owner, now + self.member_ttl_ms)
        except Exception as e:
            if not is_unavailable(e):
                raise
            log.warning("could not register as a member this round: %s", e)
        metrics.PARTITIONS_OWNED.set(len(self.owned))
        return dict(self.owned)

    def _call(self, p: int, mode: str, fence: int, now: int, offer_to: str = "") -> scripts.Call:
        return leases.call(p, self.owner, self.lease_ms, now, mode, fence, offer_to)

    def lost(self, p: int, *, quiet: bool = False) -> None:
        """Our fence is stale (claim or renewal refused): stop using the partition at once."""
        if self.owned.pop(p, None) is None:
            return
        to = self.offered.pop(p, "")
        if to:
            metrics.LEASE_CHANGES.labels("handed_over").inc()
            log.info("partition %d: handed over (offered to %s)", p, to)
        else:
            metrics.LEASE_CHANGES.labels("lost").inc()
            (log.info if quiet else log.warning)(
                "partition %d: lease lost (stale fence), stopping its dispatch", p)

    async def release_all(self) -> None:
        now_arg = (await self._now()) if self.clock else 0
        calls = [self._call(p, leases.RELEASE, f, now_arg) for p, f in self.owned.items()]
        await self.call_many(self.r, calls)
        await leases.deregister(self.r, self.owner)
        self.owned.clear()
        self.offered.clear()
