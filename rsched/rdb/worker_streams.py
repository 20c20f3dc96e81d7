"""A worker's commands on the queue streams and their consumer group (keys.GROUP): reading new
entries (XREADGROUP), taking over idle ones (XAUTOCLAIM), joining, pruning and leaving the
groups, and finding the entries set aside for a job type (lua/park.lua).  Each function sends
its commands in one round trip and returns the replies parsed into entries; what to read and
what to run is the worker's (rsched.engine.worker)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsched.core.wire import as_text
from rsched.rdb import keys, scripts

Entry = tuple[str, str, dict[bytes, bytes]]
"""A stream entry as read: (stream, entry id, fields)."""


def entries(resp: Any) -> list[Entry]:
    """XREADGROUP's reply through redis-py as entries; each stream's name decoded once, not
    once per entry."""
    out: list[Entry] = []
    for s, items in resp or ():
        name = as_text(s)
        out += [(name, eid.decode(), f) for eid, f in items if f]
    return out


def raw_entries(resp: Any) -> list[Entry]:
    """A raw XREADGROUP reply (no redis-py callback) as entries: [[stream, [[id, [field, value,
    ...]], ...]], ...] (RESP2) or {stream: [...]} (RESP3); an entry deleted since it was
    delivered has no fields."""
    out: list[Entry] = []
    for s, items in resp.items() if isinstance(resp, dict) else resp or ():
        name = as_text(s)
        for eid, kv in items:
            if kv:
                it = iter(kv)
                out.append((name, eid.decode(), dict(zip(it, it, strict=True))))
    return out


def read_commands(consumer: str, streams: Sequence[str], n: int, block_ms: int | None = None,
                  probe: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """XREADGROUP of ``consumer``'s new entries, at most ``n`` a stream of ``streams`` (block
    ``block_ms``; None: no block), and with ``probe`` a second one of one entry a stream of
    those: raw commands for scripts.acommands_raw or acall_many_then (replies: raw_entries)."""
    block = () if block_ms is None else ("BLOCK", block_ms)
    cmds: list[tuple[Any, ...]] = [("XREADGROUP", "GROUP", keys.GROUP, consumer, "COUNT", n,
                                    *block, "STREAMS", *streams, *[">"] * len(streams))]
    if probe:
        cmds.append(("XREADGROUP", "GROUP", keys.GROUP, consumer, "COUNT", 1,
                     "STREAMS", *probe, *[">"] * len(probe)))
    return cmds


async def read_new(r: Any, consumer: str, streams: Sequence[str], n: int,
                   block_ms: int | None, probe: Sequence[str], held: scripts.Held
                   ) -> list[list[Entry]]:
    """The entries of read_commands' reads, one list per read (the probe's second): raw on
    one pooled connection (cheaper than redis-py's XREADGROUP and its response callback), or
    through redis-py on a cluster or after a connection error (its client retries).  An error
    reply (NOGROUP: the groups are gone) is raised."""
    if scripts.pooled(r):
        try:
            resps = await scripts.acommands_raw(
                r, read_commands(consumer, streams, n, block_ms, probe), held)
        except (RedisConnectionError, RedisTimeoutError):
            pass
        else:
            for resp in resps:
                if isinstance(resp, Exception):
                    raise resp
            return [raw_entries(resp) for resp in resps]
    got = [entries(await r.xreadgroup(keys.GROUP, consumer, dict.fromkeys(streams, ">"),
                                      count=n, block=block_ms))]
    if probe:
        got.append(entries(await r.xreadgroup(keys.GROUP, consumer, dict.fromkeys(probe, ">"),
                                              count=1, block=None)))
    return got


class Reclaimed(NamedTuple):
    """One stream's XAUTOCLAIM: the cursor to go on from and the entries taken over."""

    stream: str
    cursor: str
    entries: list[Entry]


async def reclaim(r: Any, consumer: str, streams: Sequence[str], cursors: Mapping[str, str],
                  min_idle_ms: int, count: int) -> list[Reclaimed]:
    """Take over for ``consumer`` up to ``count`` entries a stream idle for ``min_idle_ms``,
    each stream from its cursor in ``cursors`` ('0-0' when none); streams whose XAUTOCLAIM
    failed are left out."""
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xautoclaim(s, keys.GROUP, consumer, min_idle_ms,
                        start_id=cursors.get(s, "0-0"), count=count)
    return [Reclaimed(s, as_text(res[0]), [(s, as_text(eid), f) for eid, f in res[1] if f])
            for s, res in zip(streams, await pipe.execute(raise_on_error=False), strict=False)
            if not isinstance(res, Exception)]


async def pending_counts(r: Any, streams: Sequence[str], consumer: str) -> dict[str, int]:
    """How many entries are pending under ``consumer`` in each of ``streams`` where some are
    (XPENDING's summary; a stream whose read failed is left out, with -1)."""
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xpending(s, keys.GROUP)
    out: dict[str, int] = {}
    for s, res in zip(streams, await pipe.execute(raise_on_error=False), strict=True):
        if isinstance(res, Exception):
            out[s] = -1
            continue
        n = sum(int(c["pending"]) for c in res.get("consumers") or ()
                if as_text(c["name"]) == consumer)
        if n:
            out[s] = n
    return out


def take_over(stream: str, dead: str, me: str, min_idle_ms: int, count: int) -> scripts.Call:
    """lua/take_over.lua's call: up to ``count`` entries of ``stream`` pending under the dead
    worker ``dead`` and idle ``min_idle_ms``, moved to ``me`` (reply: taken)."""
    return ("take_over", [stream], [keys.GROUP, dead, me, min_idle_ms, count])


def taken(stream: str, reply: Any) -> tuple[list[Entry], bool]:
    """take_over's reply: the entries moved, and whether some stay under the dead worker."""
    it = iter(reply[1:])
    return ([(stream, as_text(eid), dict(zip(kv[::2], kv[1::2], strict=True)))
             for eid, kv in zip(it, it, strict=True)], bool(int(reply[0])))


async def join_groups(r: Any, streams: Sequence[str]) -> None:
    """Create the consumer group of every stream, and the stream (an existing one is fine)."""
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xgroup_create(s, keys.GROUP, id="0", mkstream=True)
    for res in await pipe.execute(raise_on_error=False):
        if isinstance(res, ResponseError) and "BUSYGROUP" not in str(res):
            raise res


async def prune_consumers(r: Any, streams: Sequence[str], me: str, idle_ms: int) -> int:
    """Delete the consumers other than ``me`` idle for ``idle_ms`` with nothing pending;
    returns how many."""
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xinfo_consumers(s, keys.GROUP)
    pipe2 = r.pipeline(transaction=False)
    doomed = 0
    for s, consumers in zip(streams, await pipe.execute(raise_on_error=False), strict=True):
        if isinstance(consumers, Exception):
            continue
        for c in consumers:
            name = as_text(c["name"])
            if name != me and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                pipe2.xgroup_delconsumer(s, keys.GROUP, name)
                doomed += 1
    if doomed:
        await pipe2.execute(raise_on_error=False)
    return doomed


async def leave_groups(r: Any, streams: Sequence[str], me: str) -> bool:
    """Delete consumer ``me`` from the groups where nothing is pending under its name
    (deleting it would drop those entries from the group); returns whether entries are still
    pending under it (or could not be read)."""
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xpending_range(s, keys.GROUP, "-", "+", 1, consumername=me)
    mine = await pipe.execute(raise_on_error=False)
    pipe = r.pipeline(transaction=False)
    for s, pending in zip(streams, mine, strict=False):
        if isinstance(pending, list) and not pending:
            pipe.xgroup_delconsumer(s, keys.GROUP, me)
    await pipe.execute(raise_on_error=False)
    return any(not (isinstance(pending, list) and not pending) for pending in mine)


async def set_aside(r: Any, streams: Sequence[str], jtype: str, want: int
                    ) -> list[tuple[str, str]]:
    """(stream, entry id) of up to ``want`` entries set aside for job type ``jtype`` in
    ``streams`` (pending under its consumer, keys.parked_consumer)."""
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xpending_range(s, keys.GROUP, "-", "+", want,
                            consumername=keys.parked_consumer(jtype))
    return [(s, as_text(e["message_id"])) for s, pending in
            zip(streams, await pipe.execute(raise_on_error=False), strict=True)
            if isinstance(pending, list) for e in pending][:want]


async def entries_by_id(r: Any, ids: Sequence[tuple[str, str]]) -> list[Entry]:
    """The entries (stream, entry id) still in their streams, with their fields."""
    pipe = r.pipeline(transaction=False)
    for s, eid in ids:
        pipe.xrange(s, eid, eid)
    return [(s, eid, got[0][1]) for (s, eid), got in
            zip(ids, await pipe.execute(raise_on_error=False), strict=True)
            if isinstance(got, list) and got and got[0][1]]


__all__ = ["Entry", "Reclaimed", "entries", "entries_by_id", "join_groups", "leave_groups",
           "prune_consumers", "raw_entries", "read_commands", "read_new", "reclaim",
           "pending_counts", "set_aside", "take_over", "taken"]
