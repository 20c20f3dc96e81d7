"""Limit definitions and per-key state in Redis (docs/limits.md): lua/limit.lua's call, one per
partition written, and the reads the service makes.  The global index ``keys.limits_index()`` is
what listings read; the partitions' copies (every family in every partition, a key's own
definition in its key's partition) are what the scripts read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from rsched.core import defaults
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


def op_limit_deferred(partitions: int) -> Op[dict[str, int]]:
    """For the metrics: runs that started waiting, by definition name, summed over the
    partitions."""
    res = yield Commands([cmd("hgetall", keys.limit_stats(p)) for p in range(partitions)])
    deferred: dict[str, int] = {}
    for stats in res:
        for name, n in stats.items():
            deferred[as_text(name)] = deferred.get(as_text(name), 0) + int(n)
    return deferred


class BusyKey(NamedTuple):
    """A limit key with runs in flight, waiting, or starts in its rate window; ``name``: the
    definition that applies to it ('' = none: it runs unlimited, counted)."""

    key: str
    name: str
    in_flight: int
    waiting: int
    recent_starts: int


def limit_keys(p: int, cursor: str) -> Call:
    """lua/limit_keys.lua on partition ``p``: a page of its busy keys from ``cursor``."""
    return ("limit_keys", [keys.limits_running(p), keys.limits_waiting(p)],
            [cursor, defaults.LIMIT_KEYS_PAGE, 0])


def op_busy_keys(partitions: Iterable[int]) -> Op[list[BusyKey]]:
    """Every busy limit key of these partitions with its counts, walked a page per partition
    and round trip (each page one short script); the walk lets go of keys it finds idle."""
    cursors = dict.fromkeys(partitions, "0")
    out: list[BusyKey] = []
    while cursors:
        ps = list(cursors)
        replies = yield Scripts([limit_keys(p, cursors[p]) for p in ps])
        for p, r in zip(ps, replies, strict=True):
            if isinstance(r, Exception):
                raise r
            for i in range(1, len(r), 5):
                out.append(BusyKey(as_text(r[i]), as_text(r[i + 1]), int(r[i + 2]),
                                   int(r[i + 3]), int(r[i + 4])))
            cursors[p] = as_text(r[0])
            if cursors[p] == "0":
                del cursors[p]
    return out


__all__ = ["BusyKey", "KeyState", "limit", "limit_keys", "op_busy_keys", "op_key_state",
           "op_limit", "op_limit_deferred", "op_limits", "op_write_limit"]
