"""Start-up checks: refuse a Redis that could silently lose jobs, and pin the partition count."""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import keys
from .errors import UnsafeRedis

log = logging.getLogger("rsched")

# Redis is away (restart, failover, network): redis-py's errors are not the builtin ones.
UNAVAILABLE = (ConnectionError, OSError, TimeoutError, RedisConnectionError, RedisTimeoutError)

SAFE_POLICIES = {"noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


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


_hiredis_pack: Any
try:  # redis.asyncio always packs commands in Python; the sync client's hiredis path is slow too
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a declared dependency (redis[hiredis])
    _hiredis_pack = None


def _pack(args: tuple[Any, ...]) -> list[bytes]:
    if isinstance(args[0], str) and " " in args[0]:  # "CONFIG GET" -> two arguments
        args = (*args[0].split(), *args[1:])
    try:
        return [_hiredis_pack(args)]
    except TypeError as e:
        raise DataError(str(e)) from None


class _HiredisPack:
    """Mixin for asyncio connections: pack commands with hiredis.  redis.asyncio's Python packer
    copies its buffer once per argument, and a schedule script call has thousands of them: it
    was the API's top cost."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack(args)


class _HiredisPacker:
    """The sync client's packer: redis-py's own hiredis packer first copies every argument
    through a Python generator (to turn bytearray and memoryview into bytes), which cost as much
    as the packing; rsched sends neither, and what hiredis refuses goes the old way."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback

    def pack(self, *args: Any) -> list[bytes]:
        try:
            return _pack(args)
        except DataError:
            return self.fallback.pack(*args)  # type: ignore[no-any-return]


class _HiredisSyncPack:
    """Mixin for sync connections: build them with _HiredisPacker."""

    def _construct_command_packer(self, packer: Any) -> Any:
        default = super()._construct_command_packer(packer)  # type: ignore[misc]
        return default if packer is not None else _HiredisPacker(default)


def fast_packing(r: Any) -> Any:
    """Make a client (sync or asyncio) pack commands with hiredis; see the mixins above.
    Connections the pool already holds keep their packer; a cluster client (no single pool)
    is left as it is."""
    from redis.asyncio.connection import AbstractConnection as AsyncConnection

    pool = getattr(r, "connection_pool", None)
    if pool is None:
        return r
    cls = pool.connection_class
    mixin = _HiredisPack if issubclass(cls, AsyncConnection) else _HiredisSyncPack
    if _hiredis_pack is not None and not issubclass(cls, mixin):
        pool.connection_class = type(f"Hiredis{cls.__name__}", (mixin, cls), {})
    return r


_CONFIG_UNREADABLE = "cannot read Redis config ({}); make sure maxmemory-policy is noeviction"


def check_redis(r: Any, allow_unsafe: bool = False) -> list[str]:
    try:
        cfg = r.config_get("maxmemory-policy") | r.config_get("appendonly")
    except ResponseError as e:  # managed Redis often disables CONFIG
        return [_CONFIG_UNREADABLE.format(e)]
    return judge_config(_s(cfg["maxmemory-policy"]), _s(cfg["appendonly"]), allow_unsafe)


async def acheck_redis(r: Any, allow_unsafe: bool = False) -> list[str]:
    try:
        cfg = (await r.config_get("maxmemory-policy")) | (await r.config_get("appendonly"))
    except ResponseError as e:
        return [_CONFIG_UNREADABLE.format(e)]
    return judge_config(_s(cfg["maxmemory-policy"]), _s(cfg["appendonly"]), allow_unsafe)


def ensure_partitions(r: Any, wanted: int, explicit: bool = True) -> int:
    """Store the partition count at first start; refuse to run with a different one."""
    r.hsetnx(keys.config(), "partitions", wanted)
    return _stored(r.hget(keys.config(), "partitions"), wanted, explicit)


async def aensure_partitions(r: Any, wanted: int, explicit: bool = True) -> int:
    await r.hsetnx(keys.config(), "partitions", wanted)
    return _stored(await r.hget(keys.config(), "partitions"), wanted, explicit)


def connect_async(url: str, **options: Any) -> Any:
    """An asyncio client that retries after connection errors, as the sync client does.

    redis.asyncio's from_url retries nothing by default; every rsched script is safe to apply
    twice, so retrying a command that may or may not have run is sound.
    """
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), 3)
    return fast_packing(Redis.from_url(
        url, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError], **options))
