"""Start-up checks: refuse a Redis that could silently lose jobs, and pin the partition count;
what counts as Redis being away, and the daemons' wait for it at start."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any
from urllib.parse import urlsplit

from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsched.core.errors import ClusterNodeUrl, UnsafeRedis
from rsched.core.retry import backoff_ceiling_ms
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.cluster import is_cluster
from rsched.rdb.durable import wait_of
from rsched.rdb.ops import Commands, Op, arun, cmd, run

log = logging.getLogger("rsched")

# Redis is away (restart, failover, network): redis-py's errors are not the builtin ones.  For
# `except` clauses; is_unavailable() is the judgement (it also knows uvloop's closed transport).
UNAVAILABLE = (ConnectionError, OSError, TimeoutError, RedisConnectionError, RedisTimeoutError,
               ClusterDownError, TryAgainError)  # a cluster mid-failover: its slots come back

# A daemon started before Redis tries again after 0.1 s, doubling up to 5 s between tries.
STARTUP_RETRY_BASE_MS = 100
STARTUP_RETRY_CAP_MS = 5000


def closed_transport(exc: BaseException) -> bool:
    """uvloop's error for a write to a connection that Redis or the network dropped:
    ``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the handler
    is closed``.  redis-py passes it through as it is, not as a connection error."""
    return type(exc) is RuntimeError and "unable to perform operation on" in str(exc)


def is_unavailable(exc: BaseException) -> bool:
    """Redis cannot be reached right now (wait and retry), as opposed to a refusal that retrying
    cannot fix: a wrong password is a ConnectionError subclass for redis-py, not an outage."""
    if isinstance(exc, AuthenticationError):
        return False
    return isinstance(exc, UNAVAILABLE) or closed_transport(exc)


def redis_address(url: str) -> str:
    """host:port (or the socket path) of a Redis URL, without credentials, for log lines."""
    u = urlsplit(url)
    if u.scheme == "unix":
        return u.path
    try:
        port = u.port or 6379
    except ValueError:
        return u.hostname or url
    return f"{u.hostname or 'localhost'}:{port}"


class StartupRetry:
    """A daemon's start-up against a Redis that is not up yet: the wait before each new try
    (capped exponential backoff) and one log line per wait.  Only unavailability is retried."""

    def __init__(self, url: str, base_ms: int = STARTUP_RETRY_BASE_MS,
                 cap_ms: int = STARTUP_RETRY_CAP_MS) -> None:
        self.address = redis_address(url)
        self.base_ms, self.cap_ms, self.failures = base_ms, cap_ms, 0

    def delay_s(self, exc: BaseException) -> float | None:
        """Seconds to wait after ``exc`` before trying again; None: not an outage, give up."""
        if not is_unavailable(exc):
            return None
        delay_s = backoff_ceiling_ms(self.failures, self.base_ms, self.cap_ms) / 1000
        self.failures += 1
        log.warning("Redis at %s unreachable (%s); retrying in %g s", self.address, exc, delay_s)
        return delay_s


class Outage:
    """A loop's record of Redis being away, so its log says when Redis came back and not only
    when it went: ``down`` notes the first failure (and logs each one unless the caller already
    did), ``up`` after a success logs once how long Redis was unreachable."""

    __slots__ = ("log", "since")

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self.since: float | None = None  # monotonic time of the first failure of this outage

    def down(self, exc: BaseException, *, logged: bool = False) -> None:
        if self.since is None:
            self.since = time.monotonic()
        if not logged:
            self.log.warning("redis unavailable: %s", exc)

    def up(self) -> None:
        if self.since is not None:
            self.log.warning("redis reachable again after %.1f s", time.monotonic() - self.since)
            self.since = None


def _op_start_up(url: str) -> Generator[float | None, BaseException | None, bool]:
    """A daemon's start-up loop, free of I/O: yields None for a try of its setup (send back the
    error, None once it worked), then the seconds to wait before the next; the drivers below
    end it early when stopped.  Any error but unavailability is raised at once."""
    retry = StartupRetry(url)
    while True:
        exc = yield None
        if exc is None:
            return True
        delay_s = retry.delay_s(exc)
        if delay_s is None:
            raise exc
        yield delay_s


_CANCEL_GRACE_S = 1.0
"""How long a stop waits for the connection attempt it cancelled to end."""


async def wait_for_redis(setup: Callable[[], Awaitable[object]], url: str,
                         stop: asyncio.Event) -> bool:
    """Run a daemon's ``setup`` (checks, partitions, groups) until Redis answers it: True once it
    succeeded, False if ``stop`` came first (also while a connection attempt hangs).  Any other
    error (an unsafe Redis, a wrong password) is raised at once."""
    steps = _op_start_up(url)
    stopped = asyncio.ensure_future(stop.wait())
    attempt: asyncio.Future[object] | None = None
    try:
        delay_s = next(steps)
        while True:
            if delay_s is None:
                attempt = asyncio.ensure_future(setup())
                await asyncio.wait([attempt, stopped], return_when=asyncio.FIRST_COMPLETED)
                if not attempt.done():
                    return False
                delay_s = steps.send(attempt.exception())
            else:
                await asyncio.wait([stopped], timeout=delay_s)
                if stop.is_set():
                    return False
                delay_s = next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        stopped.cancel()
        if attempt is not None and not attempt.done():
            attempt.cancel()  # stopped while it connects
            # Bounded: an attempt that swallows its cancellation would otherwise hold the stop for
            # all its retries (4 x socket_timeout: once 21 s in a loaded test run).
            await asyncio.wait([attempt], timeout=_CANCEL_GRACE_S)
            if not attempt.done():
                log.warning("a Redis connection attempt did not end when cancelled; not waiting")


def wait_for_redis_sync(setup: Callable[[], object], url: str, stop: threading.Event) -> bool:
    """wait_for_redis for a thread (the archiver); ``stop`` is checked between tries."""
    steps = _op_start_up(url)
    try:
        delay_s = next(steps)
        while not stop.is_set():
            if delay_s is None:
                error: Exception | None = None
                try:
                    setup()
                except Exception as e:  # noqa: BLE001 - judged by StartupRetry, raised unless an outage
                    error = e
                delay_s = steps.send(error)
            else:
                stop.wait(delay_s)
                delay_s = next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return False

SAFE_POLICIES = {"noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}



def judge_config(policy: str, aof: str, allow_unsafe: bool) -> list[str]:
    """Raise UnsafeRedis on an evicting maxmemory-policy; return warnings (AOF off)."""
    warnings: list[str] = []
    if policy not in SAFE_POLICIES:
        msg = (f"Redis maxmemory-policy is {policy}: Redis may evict jobs and schedules silently; "
               "set it to noeviction (CONFIG SET maxmemory-policy noeviction)")
        if not allow_unsafe:
            raise UnsafeRedis(msg)
        warnings.append(msg)
    if aof != "yes":
        warnings.append("Redis AOF is off: a Redis crash loses recent jobs; "
                        "set appendonly yes, appendfsync everysec")
    for w in warnings:
        log.warning(w)
    return warnings


def _stored(raw: Any, wanted: int, explicit: bool) -> int:
    stored = int(raw)
    if stored != wanted and explicit:
        raise UnsafeRedis(
            f"this Redis was set up with {stored} partitions, not {wanted}: job ids encode "
            f"their partition, so the count cannot change (set RSCHED_PARTITIONS={stored})"
        )
    return stored


_CONFIG_UNREADABLE = "cannot read Redis config ({}); make sure maxmemory-policy is noeviction"


def judge_topology(cluster_enabled: bool, role: str, cluster_client: bool) -> None:
    """Refuse a plain URL that reaches a cluster node or a replica: with it rsched would lease
    only the partitions on that node, or write nowhere."""
    if cluster_enabled and not cluster_client:
        raise ClusterNodeUrl()
    if role not in ("master", ""):
        raise UnsafeRedis(f"this Redis is a replica ({role}): use the primary's URL, or "
                          "redis+sentinel://host:port[,...]/<service> to follow failovers")


def replicas_short(wanted: int, replicas: dict[str, int]) -> str | None:
    """Why writes that wait for ``wanted`` replicas cannot be confirmed (None: they can):
    ``replicas`` is each master's count.  Every such write would be applied on the master and
    reported as failed, and a retry without an idempotency key would apply it again.  Judged
    by the master with the most: one master short of replicas (its own just failed over) is
    doctor's finding, not a reason to refuse every process."""
    most = max(replicas.values(), default=0)
    if most >= wanted:
        return None
    has = "the master has" if len(replicas) <= 1 else "no master has more than"
    setting = (f"RSCHED_WAIT_REPLICAS={most}" if most else
               "RSCHED_WAIT_REPLICAS=0 to acknowledge writes on the master's word")
    return (f"writes wait for {wanted} replica(s) (RSCHED_WAIT_REPLICAS), but {has} {most}: "
            f"each write would be applied yet reported as failed; add replicas, or set {setting}")


def judge_replicas(wanted: int, replicas: dict[str, int]) -> None:
    """Raise UnsafeRedis when the masters have fewer replicas than writes wait for."""
    if (why := replicas_short(wanted, replicas)) is not None:
        raise UnsafeRedis(why)


def cluster_replicas(nodes: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Replicas of each master that holds slots, from CLUSTER NODES as redis-py parses it
    (address -> node_id, flags, master_id, slots); a replica marked failed still counts: it is
    the master's, only down."""
    masters = {as_text(n["node_id"]): addr for addr, n in nodes.items()
               if "master" in as_text(n["flags"]) and n.get("slots")}
    count = dict.fromkeys(masters.values(), 0)
    for n in nodes.values():
        if "slave" in as_text(n["flags"]) and (master := masters.get(as_text(n["master_id"]))):
            count[master] += 1
    return count


def op_check_topology(cluster: bool = False, wait_replicas: int = 0,
                      config: bool = False) -> Op[tuple[list[Any], list[Any]]]:
    """Raise UnsafeRedis on a plain URL at a cluster node or replica, and when writes wait for
    more replicas than a master has; with ``config``, also fetch (CONFIG GET) the eviction
    policy and AOF setting, in the same round trip: (INFO replies, CONFIG replies)."""
    nodes = cluster and wait_replicas > 0
    res = yield Commands([
        cmd("info", "cluster"), cmd("info", "replication"),
        *([cmd("execute_command", "CLUSTER NODES")] if nodes else []),
        *([cmd("config_get", "maxmemory-policy"), cmd("config_get", "appendonly")]
          if config else [])], raise_on_error=False)
    info, rest = res[:2], res[2:]
    if not any(isinstance(r, Exception) for r in info):  # managed Redis may rename INFO
        judge_topology(bool(int(info[0].get("cluster_enabled", 0))),
                       as_text(info[1].get("role", "")), cluster)
        if wait_replicas > 0 and not nodes:
            judge_replicas(wait_replicas, {"": int(info[1].get("connected_slaves", 0))})
    if nodes:
        if isinstance(rest[0], dict):  # an error (CLUSTER renamed): the writes will tell
            judge_replicas(wait_replicas, cluster_replicas(rest[0]))
        rest = rest[1:]
    return info, rest


def op_check_redis(allow_unsafe: bool = False, cluster: bool = False,
                   wait_replicas: int = 0) -> Op[list[str]]:
    """Raise UnsafeRedis on an evicting Redis, on a plain URL at a cluster node or replica, or
    when writes wait for more replicas than a master has; return the warnings (AOF off,
    CONFIG disabled)."""
    _, cfg = yield from op_check_topology(cluster, wait_replicas, config=True)
    for res in cfg:
        if isinstance(res, ResponseError):  # managed Redis often disables CONFIG
            return [_CONFIG_UNREADABLE.format(res)]
    return judge_config(as_text(cfg[0]["maxmemory-policy"]), as_text(cfg[1]["appendonly"]),
                        allow_unsafe)


def _wanted(r: Any) -> int:
    """Replicas the client's durable writes wait for (its rdb.durable setting)."""
    wait = wait_of(r)
    return wait.replicas if wait is not None else 0


def check_redis(r: Any, allow_unsafe: bool = False) -> list[str]:
    """A process's start-up check (see op_check_redis), for the client it will write with."""
    return run(r, op_check_redis(allow_unsafe, is_cluster(r), _wanted(r)))


async def acheck_redis(r: Any, allow_unsafe: bool = False) -> list[str]:
    return await arun(r, op_check_redis(allow_unsafe, is_cluster(r), _wanted(r)))


def check_topology(r: Any, replicas: bool = True) -> None:
    """A command's check before it reads or writes: the URL reaches what it names (no plain URL
    at a cluster node or a replica) and, with ``replicas``, the masters have the replicas the
    client's writes wait for.  One round trip; the eviction policy is doctor's and the
    processes' to judge."""
    run(r, op_check_topology(is_cluster(r), _wanted(r) if replicas else 0))


def op_ensure_partitions(wanted: int, explicit: bool = True) -> Op[int]:
    """Store the partition count at first start; refuse to run with a different one."""
    _, stored = yield Commands([cmd("hsetnx", keys.config(), "partitions", wanted),
                                cmd("hget", keys.config(), "partitions")])
    return _stored(stored, wanted, explicit)


def op_read_partitions(wanted: int, explicit: bool = True) -> Op[int | None]:
    """The stored partition count (None: none stored yet), refused as op_ensure_partitions
    refuses it."""
    (raw,) = yield Commands([cmd("hget", keys.config(), "partitions")])
    return None if raw is None else _stored(raw, wanted, explicit)


def stored_partitions(r: Any) -> int:
    """The partition count stored in Redis, as it is (0: none yet), on a sync client."""
    return int(r.hget(keys.config(), "partitions") or 0)


def ensure_partitions(r: Any, wanted: int, explicit: bool = True) -> int:
    return run(r, op_ensure_partitions(wanted, explicit))


async def aensure_partitions(r: Any, wanted: int, explicit: bool = True) -> int:
    return await arun(r, op_ensure_partitions(wanted, explicit))
