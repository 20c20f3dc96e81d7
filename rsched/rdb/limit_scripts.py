"""Limit definitions and per-key state in Redis (docs/limits.md): lua/limit.lua's call, one per
partition written, and the reads the service makes.  The global index ``keys.limits_index()`` is
what listings read; the partitions' copies (every family in every partition, a key's own
definition in its key's partition) are what the scripts read."""

from __future__ import annotations

from typing import Any, NamedTuple

from rsched.core.ids import partition_for_key
from rsched.core.limits import FAMILY, Limit
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, Scripts, cmd
from rsched.rdb.scripts import Call


def limit(p: int, name: str, packed: str) -> Call:
    """lua/limit.lua on partition ``p``: store ``packed`` under ``name`` ('' deletes it)."""
    return ("limit", [keys.limits(p), keys.retry(p), keys.limits_waiting(p)], [name, packed, 0])


def op_write_limit(name: str, packed: str, partitions: int) -> Op[int]:
    """Write (``packed`` '' deletes) a definition: the global index first, then the copy of
    every partition a family applies in (all), or of the one partition a key lives in, each
    applied at once there.  Safe to repeat: a write cut short is completed by the next.
    Returns how many waiting runs it admitted."""
    if packed:
        index = cmd("hset", keys.limits_index(), name, packed)
    else:
        index = cmd("hdel", keys.limits_index(), name)
    yield Commands([index], durable=True)
    parts = range(partitions) if name.endswith(FAMILY) else [partition_for_key(name, partitions)]
    replies = yield Scripts([limit(p, name, packed) for p in parts], durable=True)
    for r in replies:
        if isinstance(r, Exception):
            raise r
    return sum(int(r) for r in replies)


def op_limit(name: str) -> Op[Limit | None]:
    """The definition stored under ``name`` (None: none)."""
    (raw,) = yield Commands([cmd("hget", keys.limits_index(), name)])
    return None if raw is None else Limit.unpacked(name, as_text(raw))


def op_limits() -> Op[list[Limit]]:
    """Every definition, by name."""
    (raw,) = yield Commands([cmd("hgetall", keys.limits_index())])
    return sorted((Limit.unpacked(as_text(k), as_text(v)) for k, v in raw.items()),
                  key=lambda lim: lim.name)


class KeyState(NamedTuple):
    """One limit key's counts: runs holding a slot, runs waiting, starts in the rate window."""

    in_flight: int
    waiting: int
    recent_starts: int


def op_key_state(p: int, key: str, window_start_ms: int) -> Op[KeyState]:
    """The counts of limit key ``key`` (in its partition ``p``); starts since
    ``window_start_ms`` on Redis's clock."""
    res: list[Any] = yield Commands([
        cmd("scard", keys.limit_running(p, key)), cmd("zcard", keys.limit_waiting(p, key)),
        cmd("zcount", keys.limit_log(p, key), f"({window_start_ms}", "+inf")])
    return KeyState(int(res[0]), int(res[1]), int(res[2]))


def op_limit_counts(partitions: int) -> Op[tuple[dict[str, int], dict[str, int]]]:
    """For the metrics: runs that started waiting, by definition name, summed over the
    partitions; and runs waiting now, by limit key (only keys with waiting runs are read)."""
    res = yield Commands([c for p in range(partitions)
                          for c in (cmd("hgetall", keys.limit_stats(p)),
                                    cmd("smembers", keys.limits_waiting(p)))])
    deferred: dict[str, int] = {}
    waiting_keys: list[tuple[int, str]] = []
    for p in range(partitions):
        for name, n in res[2 * p].items():
            deferred[as_text(name)] = deferred.get(as_text(name), 0) + int(n)
        waiting_keys += [(p, as_text(k)) for k in res[2 * p + 1]]
    if not waiting_keys:
        return deferred, {}
    counts = yield Commands([cmd("zcard", keys.limit_waiting(p, k)) for p, k in waiting_keys])
    return deferred, {k: int(n) for (_, k), n in zip(waiting_keys, counts, strict=True) if n}


__all__ = ["KeyState", "limit", "op_key_state", "op_limit", "op_limit_counts", "op_limits",
           "op_write_limit"]
