"""Commands on what no partition holds: Redis's clock, the dispatchers' wake channel, the API
keys hash and the overview's stats samples; each an Op of one round trip, but for the wake
channel's messages as a dispatcher listens to them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, cmd


def time_ms(reply: Any) -> int:
    """A TIME reply (seconds, microseconds; ints or bytes) in ms."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


def op_redis_time() -> Op[int]:
    """Redis's clock (ms)."""
    (reply,) = yield Commands([cmd("time")])
    return time_ms(reply)


def op_publish_wake(partitions: Iterable[int]) -> Op[None]:
    """Tell the dispatchers these partitions have new due work (one message each)."""
    yield Commands([cmd("publish", keys.wake_channel(), n) for n in partitions])


async def wake_messages(r: Any) -> AsyncIterator[int | None]:
    """The partitions named by the messages on the dispatchers' wake channel, as they come
    (None: a message that names none, i.e. any partition), on an asyncio client; ends with an
    error when the connection drops."""
    ps = r.pubsub(ignore_subscribe_messages=True)
    await ps.subscribe(keys.wake_channel())
    async for msg in ps.listen():
        if msg and msg.get("type") == "message":
            try:
                yield int(msg.get("data"))  # op_publish_wake names the partition
            except (TypeError, ValueError):
                yield None


# --- API keys: HASH rsched:apikeys, secret hash -> packed record ---------------------------------


def op_put_api_key(secret_hash: str, record: bytes) -> Op[None]:
    """Store a key's record under its secret's hash (replicas confirm it)."""
    yield Commands([cmd("hset", keys.api_keys(), secret_hash, record)], durable=True)


def op_api_keys() -> Op[dict[bytes, bytes]]:
    """Every key's record by its secret's hash."""
    (raw,) = yield Commands([cmd("hgetall", keys.api_keys())])
    return raw  # type: ignore[no-any-return]


def op_api_key(secret_hash: str) -> Op[bytes | None]:
    """The record stored under a secret's hash (None: no such key)."""
    (raw,) = yield Commands([cmd("hget", keys.api_keys(), secret_hash)])
    return raw  # type: ignore[no-any-return]


def op_delete_api_key(secret_hash: bytes | str) -> Op[None]:
    """Delete the key stored under a secret's hash (replicas confirm it)."""
    yield Commands([cmd("hdel", keys.api_keys(), secret_hash)], durable=True)


# --- stats samples: ZSET rsched:stats:samples, JSON sample -> its bucket's start (ms) -----------


def op_add_sample(sample: str, bucket_ms: int, drop_before_ms: int) -> Op[None]:
    """Store a sample under its bucket and drop those of buckets before ``drop_before_ms``."""
    yield Commands([cmd("zadd", keys.stats_samples(), {sample: bucket_ms}),
                    cmd("zremrangebyscore", keys.stats_samples(), "-inf", drop_before_ms)])


def op_samples(since_ms: int, limit: int) -> Op[list[Any]]:
    """The newest ``limit`` samples of buckets from ``since_ms`` on, newest first."""
    (raw,) = yield Commands([cmd("zrevrangebyscore", keys.stats_samples(), "+inf", since_ms,
                                 start=0, num=limit)])
    return raw  # type: ignore[no-any-return]


__all__ = ["op_add_sample", "op_api_key", "op_api_keys", "op_delete_api_key",
           "op_publish_wake", "op_put_api_key", "op_redis_time", "op_samples", "time_ms",
           "wake_messages"]
