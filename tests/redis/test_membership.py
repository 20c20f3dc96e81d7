"""Dispatcher membership and partition hand-over: who may be given a partition, and how fast the
partitions of a dead dispatcher are taken over.

The planner is a pure function (table tests); the rest steps LeaseKeeper.run_once of several
dispatchers against a real redis-server with an injected clock, each on its own renewal
schedule, and checks the leases after every 100 ms of simulated time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis
import redis.asyncio as aioredis
from support.helpers import PARTITIONS, ManualClock, aredis

from rsched.engine.dispatcher import LeaseKeeper
from rsched.engine.dispatcher.leases import LeaseView, Plan, plan_round
from rsched.rdb import keys

LEASE_MS = 10_000
RENEW_MS = LEASE_MS // 4  # LeaseKeeper.renew_every_ms
STEP_MS = 100
NOW = 100_000


def held_by(owner: str, ps: range | list[int]) -> dict[int, LeaseView]:
    return {p: LeaseView(owner) for p in ps}


def views(spec: dict[int, LeaseView], partitions: int = 8) -> list[LeaseView]:
    """Every partition not in `spec` free since NOW."""
    return [spec.get(p, LeaseView("", free_since_ms=NOW)) for p in range(partitions)]


@pytest.mark.parametrize(
    ("me", "live", "leases", "mine", "expected"),
    [
        # alone, everything free: take it all
        ("a", ["a"], views({}), [], Plan({}, list(range(8)))),
        # a live member with nothing: offer it the upper half, keep renewing until it takes it
        ("a", ["a", "b"], views(held_by("a", range(8))), range(8),
         Plan(dict.fromkeys(range(4), "") | dict.fromkeys(range(4, 8), "b"), [])),
        # a member no longer live holds half: its leases will free up, so nothing is offered
        # to the newcomer and nothing of ours moves
        ("a", ["a", "c"], views(held_by("a", range(4)) | held_by("b", range(4, 8))), range(4),
         Plan(dict.fromkeys(range(4), ""), [])),
        # ... and once they are free, the newcomer (short of 4) takes them, not us
        ("a", ["a", "c"], views(held_by("a", range(4))), range(4),
         Plan(dict.fromkeys(range(4), ""), [])),
        ("c", ["a", "c"], views(held_by("a", range(4))), [], Plan({}, [4, 5, 6, 7])),
        # offered to us by a live owner while we are short: take them over
        ("b", ["a", "b"],
         views(held_by("a", range(4)) | {p: LeaseView("a", "b") for p in range(4, 8)}), [],
         Plan({}, [4, 5, 6, 7])),
        # offered to us while we hold our share already (the owner's view is older): decline
        ("b", ["a", "b"],
         views(held_by("a", range(3)) | {3: LeaseView("a", "b")} | held_by("b", range(4, 8))),
         range(4, 8), Plan(dict.fromkeys(range(4, 8), ""), [])),
        # free for longer than the grace (its planned taker never came): anybody's
        ("a", ["a", "b"], views(held_by("a", range(4)) | held_by("b", range(4, 7))
                                | {7: LeaseView("", free_since_ms=NOW - RENEW_MS)}), range(4),
         Plan(dict.fromkeys(range(4), ""), [7])),
    ],
)
def test_the_planner_moves_partitions_only_to_live_members_that_are_short(
    me: str, live: list[str], leases: list[LeaseView], mine: range | list[int], expected: Plan
) -> None:
    assert plan_round(me, live, leases, set(mine), NOW, RENEW_MS) == expected


def test_every_member_plans_the_same_even_split_from_the_same_leases() -> None:
    members = ["d1", "d2", "d3"]
    leases = views(held_by("d1", range(10)) | held_by("d2", range(10, 14)), PARTITIONS)
    plans = {m: plan_round(m, members, leases, {p for p, v in enumerate(leases) if v.owner == m},
                           NOW, RENEW_MS) for m in members}
    offered = [to for plan in plans.values() for to in plan.keep.values() if to]
    free_taken = sorted(p for plan in plans.values() for p in plan.take)
    assert free_taken == [14, 15]  # both free partitions, each by one member
    assert sorted(offered) == ["d3"] * 4  # d1's excess covers what the free ones do not
    # 6/5/5: d2 takes one free partition, d3 the other and later the 4 d1 offers it
    assert {m: len(plans[m].keep) + len(plans[m].take) for m in members} == \
        {"d1": 10, "d2": 5, "d3": 1}


# --- several keepers on one injected clock -----------------------------------------------------


class Fleet:
    """Keepers that each run a round every RENEW_MS from their own start; killed ones stop."""

    def __init__(self, ar: aioredis.Redis, r: redis.Redis, clock: ManualClock) -> None:
        self.ar, self.r, self.clock = ar, r, clock
        self.keepers: dict[str, LeaseKeeper] = {}
        self.next_ms: dict[str, int] = {}
        self.last_round_ms: dict[str, int] = {}

    def join(self, name: str) -> LeaseKeeper:
        self.keepers[name] = LeaseKeeper(self.ar, name, PARTITIONS, LEASE_MS, self.clock)
        self.next_ms[name] = self.clock()
        return self.keepers[name]

    def kill(self, name: str) -> None:
        """kill -9: no release, no deregistration."""
        del self.keepers[name], self.next_ms[name]

    def owners(self) -> dict[int, str]:
        """Partition -> owner whose lease has not expired ('' when nobody holds it)."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(PARTITIONS):
            pipe.hmget(keys.lease(p), "owner", "expires_ms")
        out = {}
        for p, (owner, expires) in enumerate(pipe.execute()):
            live = owner and int(expires or 0) > self.clock()
            out[p] = owner.decode() if live else ""
        return out

    def fences(self) -> list[int]:
        return [int(self.r.hget(keys.lease(p), "fence") or 0) for p in range(PARTITIONS)]

    async def run_until(self, until_ms: int,
                        check: Callable[[int, dict[int, str]], None] | None = None) -> None:
        """Step the clock; each keeper runs when its round is due; check the leases each step."""
        while self.clock() < until_ms:
            for name in sorted(self.keepers, key=self.next_ms.__getitem__):
                if self.next_ms[name] <= self.clock():
                    await self.keepers[name].run_once()
                    self.last_round_ms[name] = self.clock()
                    self.next_ms[name] = self.clock() + RENEW_MS
            if check:
                check(self.clock(), self.owners())
            self.clock.advance(STEP_MS)


def settled(fleet: Fleet, names: list[str]) -> dict[int, str]:
    owners = fleet.owners()
    assert sorted(set(owners.values())) == sorted(names)
    assert {list(owners.values()).count(n) for n in names} <= \
        {PARTITIONS // len(names), -(-PARTITIONS // len(names))}
    return owners


async def start(fleet: Fleet, names: list[str]) -> dict[int, str]:
    """Start keepers 1.5 s apart (out of step with each other) and let them settle."""
    for name in names:
        fleet.join(name)
        await fleet.run_until(fleet.clock() + 1500)
    await fleet.run_until(fleet.clock() + 3 * RENEW_MS)
    return settled(fleet, names)


def simulate(redis_url: str, r: redis.Redis, clock: ManualClock,
             body: Callable[[Fleet], Awaitable[None]]) -> None:
    async def scenario() -> None:
        async with aredis(redis_url) as ar:
            await body(Fleet(ar, r, clock))

    asyncio.run(scenario())


def never_unowned(parts: list[int], seen: list[tuple[int, int]]) -> Callable[..., None]:
    def check(now: int, owners: dict[int, str]) -> None:
        seen.extend((now, p) for p in parts if owners[p] == "")
    return check


def test_a_registered_but_dead_member_is_never_given_the_partitions_a_healthy_one_holds(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    unowned: list[tuple[int, int]] = []

    async def body(fleet: Fleet) -> None:
        await start(fleet, ["d1"])
        await fleet.join("d2").run_once()  # registers, and dies before its next round
        fleet.kill("d2")
        await fleet.run_until(clock() + 3 * LEASE_MS,
                              never_unowned(list(range(PARTITIONS)), unowned))
        settled(fleet, ["d1"])

    simulate(redis_url, r, clock, body)
    assert unowned == []


@pytest.mark.parametrize("restart_after_ms", [1000, 3000])
def test_killing_one_of_two_delays_only_its_partitions_by_at_most_lease_plus_one_renewal(
    redis_url: str, r: redis.Redis, clock: ManualClock, restart_after_ms: int
) -> None:
    unowned: list[tuple[int, int]] = []
    taken_at: dict[int, int] = {}

    async def body(fleet: Fleet) -> None:
        before = await start(fleet, ["d1", "d2"])
        healthy = [p for p, o in before.items() if o == "d1"]
        victim = [p for p, o in before.items() if o == "d2"]
        await fleet.run_until(fleet.next_ms["d2"] + STEP_MS)  # d2's round, then kill -9
        killed_at = fleet.last_round_ms["d2"]
        fleet.kill("d2")

        def check(now: int, owners: dict[int, str]) -> None:
            never_unowned(healthy, unowned)(now, owners)
            for p in victim:
                if owners[p] not in ("", "d2"):
                    taken_at.setdefault(p, now)
            if now == killed_at + restart_after_ms:
                fleet.join("d3")  # the replacement, under a new id

        await fleet.run_until(killed_at + 2 * LEASE_MS, check)
        settled(fleet, ["d1", "d3"])
        fences = fleet.fences()
        await fleet.run_until(clock() + 3 * RENEW_MS)
        assert fleet.fences() == fences  # settled: nothing moves back and forth
        assert sorted(taken_at) == victim
        assert max(taken_at.values()) - killed_at <= LEASE_MS + RENEW_MS

    simulate(redis_url, r, clock, body)
    assert unowned == []


def test_under_overlapping_faults_free_partitions_wait_at_most_lease_plus_two_renewals(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    """d2 dies; a replacement registers just before d2's leases expire and dies too, so the
    plan gives it partitions it never takes: the others take them after the grace."""
    unowned: list[tuple[int, int]] = []
    free_for: dict[int, int] = {}

    async def body(fleet: Fleet) -> None:
        before = await start(fleet, ["d1", "d2"])
        healthy = [p for p, o in before.items() if o == "d1"]
        killed_at = fleet.last_round_ms["d2"]
        fleet.kill("d2")
        await fleet.run_until(killed_at + LEASE_MS - 200, never_unowned(healthy, unowned))
        await fleet.join("d0").run_once()  # sorts first: the plan gives it free partitions
        fleet.kill("d0")
        fleet.join("d3")
        expired_at = killed_at + LEASE_MS

        def check(now: int, owners: dict[int, str]) -> None:
            never_unowned(healthy, unowned)(now, owners)
            for p, o in owners.items():
                if o == "" and now >= expired_at:
                    free_for[p] = now - expired_at

        await fleet.run_until(killed_at + 3 * LEASE_MS, check)
        settled(fleet, ["d1", "d3"])

    simulate(redis_url, r, clock, body)
    assert unowned == []
    assert free_for and max(free_for.values()) <= 2 * RENEW_MS


def test_a_joining_member_gets_its_share_without_a_gap_and_each_moved_partition_moves_once(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    unowned: list[tuple[int, int]] = []

    async def body(fleet: Fleet) -> None:
        await start(fleet, ["d1"])
        fences = fleet.fences()
        fleet.join("d0")  # sorts before d1: a modulo split would move every partition
        await fleet.run_until(clock() + 4 * RENEW_MS,
                              never_unowned(list(range(PARTITIONS)), unowned))
        owners = settled(fleet, ["d0", "d1"])
        changed = [b - a for a, b in zip(fences, fleet.fences(), strict=True)]
        assert [p for p, c in enumerate(changed) if c] == \
            sorted(p for p, o in owners.items() if o == "d0")
        assert set(changed) == {0, 1}  # a partition moved moved once
        await fleet.keepers["d0"].release_all()  # graceful stop: d1's next round takes all
        fleet.kill("d0")
        await fleet.run_until(clock() + RENEW_MS + STEP_MS)
        assert fleet.owners() == dict.fromkeys(range(PARTITIONS), "d1")

    simulate(redis_url, r, clock, body)
    assert unowned == []


def test_a_round_that_sees_a_dead_members_lease_names_its_expiry_and_the_next_takes_it(
    redis_url: str, r: redis.Redis, clock: ManualClock
) -> None:
    """The dispatcher schedules a round at orphan_expiry_in_ms: a dead member's partitions are
    taken over the moment its leases run out, not up to a renewal later."""

    async def body(fleet: Fleet) -> None:
        await start(fleet, ["d1", "d2"])
        await fleet.run_until(fleet.next_ms["d2"] + STEP_MS)  # d2's round, then kill -9
        killed_at = fleet.last_round_ms["d2"]
        fleet.kill("d2")
        d1 = fleet.keepers["d1"]
        clock.ms = killed_at + d1.member_ttl_ms + 1  # d2 no longer registered, leases held
        assert len(await d1.run_once()) == PARTITIONS // 2
        assert d1.orphan_expiry_in_ms == LEASE_MS - d1.member_ttl_ms - 1
        clock.ms = killed_at + LEASE_MS  # the moment they run out
        assert len(await d1.run_once()) == PARTITIONS
        assert d1.orphan_expiry_in_ms is None

    simulate(redis_url, r, clock, body)
