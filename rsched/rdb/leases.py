"""The dispatchers' partition leases: the lease script's call (lua/lease.lua, KEYS and ARGV in
the order of its header) and its reply, the read of every lease and of the live members
(ZSET rsched:dispatchers, member -> its registration's expiry in ms), a member's registration
and Redis's clock.  Which leases to take, keep or offer is the engine's
(rsched.engine.dispatcher.leases)."""

from __future__ import annotations

from typing import Any, NamedTuple

from rsched.core.codes import LeaseCode
from rsched.rdb import keys
from rsched.rdb.scripts import Call
from rsched.rdb.shared_keys import time_ms

# lease.lua's modes (its ARGV[4]).
ACQUIRE, RENEW, RELEASE = "acquire", "renew", "release"


def call(p: int, owner: str, lease_ms: int, now_ms: int, mode: str, fence: int,
         offer_to: str = "") -> Call:
    """The lease call on partition ``p`` for ``owner``: ``mode`` ACQUIRE, RENEW (offering it
    to ``offer_to``, '' for none) or RELEASE, with the ``fence`` it holds (0 to acquire);
    ``now_ms`` 0: Redis TIME."""
    return ("lease", [keys.lease(p), keys.stats(p)], [owner, lease_ms, now_ms, mode, fence,
                                                       offer_to])


class LeaseReply(NamedTuple):
    """lease.lua's reply: whether the caller holds the lease, and its fencing token."""

    code: LeaseCode
    fence: int

    @classmethod
    def of(cls, reply: Any) -> LeaseReply:
        return cls(LeaseCode(int(reply[0])), int(reply[1]))


class StoredLease(NamedTuple):
    """One partition's lease hash as stored (expired or not: the reader judges)."""

    owner: str  # '' when never leased, or released
    expires_ms: int
    offer: str  # the member its owner offers it to ('' for none)


class LeasesRead(NamedTuple):
    """The live members and every partition's lease (one round trip); ``failed`` holds the
    errors of the reads that failed (a cluster master is down: the rest is then empty), of
    ``sent`` reads in all."""

    members: list[str]
    leases: list[StoredLease]
    failed: list[Exception]
    sent: int


async def read_leases(r: Any, partitions: int, now_ms: int) -> LeasesRead:
    """Drop the members whose registration expired by ``now_ms``, then read those left and
    the lease of each of ``partitions``."""
    pipe = r.pipeline(transaction=False)
    pipe.zremrangebyscore(keys.dispatchers(), "-inf", now_ms)
    pipe.zrange(keys.dispatchers(), 0, -1)
    for p in range(partitions):
        pipe.hmget(keys.lease(p), "owner", "expires_ms", "offer")
    res = await pipe.execute(raise_on_error=False)
    failed = [x for x in res if isinstance(x, Exception)]
    if failed:
        return LeasesRead([], [], failed, len(res))
    leases = [StoredLease(owner.decode() if owner else "", int(expires or 0),
                          offer.decode() if offer else "")
              for owner, expires, offer in res[2:]]
    return LeasesRead([m.decode() for m in res[1]], leases, [], len(res))


async def register(r: Any, owner: str, until_ms: int) -> None:
    """Register ``owner`` as a live member until ``until_ms``."""
    await r.zadd(keys.dispatchers(), {owner: until_ms})


async def deregister(r: Any, owner: str) -> None:
    """``owner`` is no longer a member."""
    await r.zrem(keys.dispatchers(), owner)


async def redis_time_ms(r: Any) -> int:
    """Redis's clock (ms)."""
    return time_ms(await r.time())


__all__ = ["ACQUIRE", "RELEASE", "RENEW", "LeaseReply", "LeasesRead", "StoredLease", "call",
           "deregister", "read_leases", "redis_time_ms", "register"]
