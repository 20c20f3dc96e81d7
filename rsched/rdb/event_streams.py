"""The partitions' events streams as the archive reads them: the archivers' consumer group
(keys.EVENTS_GROUP) and its consumers, the lag reads, and a job's recent events.  Each function
sends its commands in one pipeline and returns the replies parsed; what to read next and what to
do with the events is the archive's (rsched.archive)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from rsched.core.wire import as_text, parse_sid
from rsched.rdb import keys, scripts
from rsched.rdb.cluster import with_raw_replies
from rsched.rdb.durable import wait_of
from rsched.rdb.ops import Commands, Op, cmd
from rsched.rdb.redis_api import ResponseError
from rsched.rdb.shared_keys import time_ms

# A raw stream entry: its id and its flat [field, value, ...] list (None: deleted from the
# stream while pending).
RawEntry = tuple[bytes, list[bytes] | None]


def events_group(info: Any) -> dict[str, Any] | None:
    """The archivers' group in an events stream's XINFO GROUPS reply (keys as str); None when
    the reply is an error (no stream yet, nothing to archive) or there is no group yet."""
    if isinstance(info, Exception):
        return None
    for g in info or ():
        g = {as_text(k): v for k, v in g.items()}
        if as_text(g.get("name")) == keys.EVENTS_GROUP:
            return g
    return None


def _next_sid(sid: bytes) -> str:
    ms, seq = parse_sid(sid)
    return f"{ms}-{seq + 1}"


def trim_point(group_info: Any, pending: Any) -> str | None:
    """The id below which every entry of the stream is archived: XTRIM MINID may drop them.

    Below the last-delivered id, an entry not pending was acknowledged, i.e. committed; read the
    group (last-delivered) before XPENDING, so an entry delivered in between lies above it.
    """
    g = events_group(group_info)
    if g is None or isinstance(pending, Exception):
        return None
    if int(pending["pending"]):
        m = pending["min"]
        return m.decode() if isinstance(m, bytes) else str(m)
    ld = g["last-delivered-id"]
    if parse_sid(ld) == (0, 0):
        return None
    return _next_sid(ld)


class StreamLag(NamedTuple):
    """One events stream as the lag reads it."""

    group: dict[str, Any] | None  # the archivers' group (events_group)
    pending: int  # delivered to an archiver, not acknowledged (0 without a group)
    oldest_pending: bytes | None  # the oldest of those's id
    length: int  # XLEN


def op_read_lag(partitions: int) -> Op[tuple[int, list[StreamLag]]]:
    """Redis's clock (ms) and every partition's StreamLag: one round trip."""
    reads = []
    for p in range(partitions):
        reads += [cmd("xinfo_groups", keys.events(p)),
                  cmd("xpending", keys.events(p), keys.EVENTS_GROUP), cmd("xlen", keys.events(p))]
    res = yield Commands([*reads, cmd("time")], raise_on_error=False)
    out = []
    for p in range(partitions):
        info, pending, length = res[3 * p : 3 * p + 3]
        if isinstance(length, Exception):
            raise length
        g = events_group(info)
        n = 0 if g is None or isinstance(pending, Exception) else int(pending["pending"])
        out.append(StreamLag(g, n, pending["min"] if n else None, int(length)))
    return time_ms(res[-1]), out


def op_first_ids(starts: Sequence[tuple[int, str]]) -> Op[dict[int, bytes]]:
    """Per (partition, start): the id of the partition's first entry from ``start`` (XRANGE
    syntax: '-', '(<id>'), for those that have one: one round trip."""
    res = yield Commands([cmd("xrange", keys.events(p), min=start, count=1) for p, start in starts],
                         raise_on_error=False)
    return {p: first[0][0] for (p, _), first in zip(starts, res, strict=True)
            if isinstance(first, list) and first}


def _raw_entries(reply: Any) -> list[RawEntry]:
    """[id, [field, value, ...]] pairs of a raw XREADGROUP reply (a RESP3 map or RESP2 list)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (items for _, items in reply)
    return [e for items in streams for e in items]


class Claimed(NamedTuple):
    """One partition's XAUTOCLAIM: the cursor to go on from, the entries claimed, and the ids
    of entries deleted from the stream while pending (to acknowledge)."""

    cursor: str
    entries: list[tuple[bytes, dict[bytes, bytes] | None]]  # (id, fields; None: deleted)
    deleted: list[bytes]


class Consumer:
    """One archiver's consumer in the archivers' group of every partition's events stream."""

    def __init__(self, r: Any, partitions: int, name: str) -> None:
        self.r = r
        # Same connections, but XREADGROUP replies stay raw lists: redis-py's per-entry dict
        # building would cost more than decoding the events.
        self._raw = with_raw_replies(r, "XREADGROUP")
        self.partitions = partitions
        self.name = name

    def create_groups(self) -> int:
        """The group on every events stream (from its oldest entry); one that exists already
        is kept.  The entries that the streams lost before a group was created here (trimmed
        while no archiver read them, lua/trim_streams.lua): never archived."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.xgroup_create(keys.events(p), keys.EVENTS_GROUP, id="0", mkstream=True)
            pipe.xinfo_stream(keys.events(p))
        replies = pipe.execute(raise_on_error=False)
        lost = 0
        for res, info in zip(replies[::2], replies[1::2], strict=True):
            if isinstance(res, ResponseError) and "BUSYGROUP" not in str(res):
                raise res
            if isinstance(res, Exception) and not isinstance(res, ResponseError):
                raise res
            if res is True and isinstance(info, dict) and "entries-added" in info:
                lost += int(info["entries-added"]) - int(info["length"])  # Redis 7+
        return lost

    def read(self, reads: Sequence[tuple[int, str, int]]) -> tuple[list[Any], list[Any] | None]:
        """Per (partition, start, count): XREADGROUP from ``start`` ('0' our own pending
        entries, '>' new ones), its entries (list of RawEntry) or its error; one round trip.
        Under the durability setting, with each read a replicated mark whose reply (or
        NotReplicated) comes second: a read whose mark is not confirmed may be lost in a
        failover."""
        wait = wait_of(self.r)
        pipe = scripts.pipeline(self._raw, wait)
        for p, start, count in reads:
            pipe.xreadgroup(keys.EVENTS_GROUP, self.name, {keys.events(p): start}, count=count)
            if wait is not None:
                pipe.set(keys.replicated_mark(p), self.name)
        replies = scripts.executed(self._raw, wait, list(scripts.confirm_last(
            self._raw, pipe, wait).execute(raise_on_error=False)))
        got, marks = (replies[::2], replies[1::2]) if wait is not None else (replies, None)
        return [res if isinstance(res, Exception) else _raw_entries(res) for res in got], marks

    def ack_and_inspect(self, ids: dict[int, list[bytes]]) -> list[tuple[int, str | None]]:
        """XACK the ids of each partition, then each one's trim point (trim_point; None: none):
        one round trip."""
        parts = sorted(p for p, these in ids.items() if these)
        pipe = self.r.pipeline(transaction=False)
        for p in parts:
            pipe.xack(keys.events(p), keys.EVENTS_GROUP, *ids[p])
        for p in parts:  # group (last-delivered) strictly before XPENDING: see trim_point
            pipe.xinfo_groups(keys.events(p))
            pipe.xpending(keys.events(p), keys.EVENTS_GROUP)
        res = pipe.execute(raise_on_error=False)
        for r in res[: len(parts)]:
            if isinstance(r, Exception):
                raise r
        return [(p, trim_point(res[len(parts) + 2 * i], res[len(parts) + 2 * i + 1]))
                for i, p in enumerate(parts)]

    def trim(self, points: Iterable[tuple[int, str]]) -> int:
        """XTRIM MINID each partition's stream at its point; the entries trimmed."""
        pipe = self.r.pipeline(transaction=False)
        for p, point in points:
            pipe.xtrim(keys.events(p), minid=point, approximate=False)
        return sum(int(n) for n in pipe.execute(raise_on_error=False) if isinstance(n, int))

    def autoclaim(self, idle_ms: int, claims: Sequence[tuple[int, str, int]]
                  ) -> list[Claimed | None]:
        """Per (partition, cursor, count): XAUTOCLAIM of entries idle ``idle_ms`` or more
        (None: the read failed, e.g. no group yet); one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for p, cursor, count in claims:
            pipe.execute_command("XAUTOCLAIM", keys.events(p), keys.EVENTS_GROUP, self.name,
                                 idle_ms, cursor, "COUNT", count)
        return [None if isinstance(res, Exception) else
                Claimed(as_text(res[0]), list(res[1]),
                        list(res[2]) if len(res) > 2 and res[2] else [])
                for res in pipe.execute(raise_on_error=False)]

    def ack(self, ids: dict[int, list[bytes]]) -> None:
        """XACK the ids of each partition, errors ignored (acknowledged again next time)."""
        pipe = self.r.pipeline(transaction=False)
        for p, these in ids.items():
            pipe.xack(keys.events(p), keys.EVENTS_GROUP, *these)
        pipe.execute(raise_on_error=False)

    def idle_consumers(self, idle_ms: int) -> list[tuple[int, bytes]]:
        """(partition, name) of the other consumers with nothing pending, silent over
        ``idle_ms``."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.xinfo_consumers(keys.events(p), keys.EVENTS_GROUP)
        return [(p, c["name"]) for p, res in enumerate(pipe.execute(raise_on_error=False))
                if not isinstance(res, Exception) for c in res
                if int(c["pending"]) == 0 and int(c["idle"]) > idle_ms
                and as_text(c["name"]) != self.name]

    def delete_consumers(self, consumers: Iterable[tuple[int, bytes]]) -> None:
        """XGROUP DELCONSUMER each (partition, name), errors ignored."""
        pipe = self.r.pipeline(transaction=False)
        for p, name in consumers:
            pipe.xgroup_delconsumer(keys.events(p), keys.EVENTS_GROUP, name)
        pipe.execute(raise_on_error=False)


def op_recent(key: str, top: str, count: int) -> Op[list[Any]]:
    """XREVRANGE of ``key`` from ``top`` down, at most ``count`` entries, as an Op."""
    (reply,) = yield Commands([cmd("xrevrange", key, max=top, min="-", count=count)])
    return reply  # type: ignore[no-any-return]


def recent(r: Any, key: str, top: str, count: int) -> list[Any]:
    """XREVRANGE of ``key`` from ``top`` down, at most ``count`` entries."""
    return r.xrevrange(key, max=top, min="-", count=count)  # type: ignore[no-any-return]


async def arecent(r: Any, key: str, top: str, count: int) -> list[Any]:
    """recent on an asyncio client."""
    return await r.xrevrange(key, max=top, min="-", count=count)  # type: ignore[no-any-return]


# --- following the streams live (waiting for a run's end, the SSE event streams) ----------------

StreamEntry = tuple[bytes, dict[bytes, bytes]]
"""An events-stream entry as XREAD and XRANGE return it: its id and its fields."""


def op_tops(partitions: Sequence[int]) -> Op[dict[int, StreamEntry | None]]:
    """Each partition's newest events-stream entry (None for an empty stream): where a reader
    that must miss nothing from now on starts."""
    got = yield Commands([cmd("xrevrange", keys.events(p), max="+", min="-", count=1)
                          for p in partitions])
    return {p: _entries(r)[0] if r else None for p, r in zip(partitions, got, strict=True)}


def _entries(reply: Any) -> list[StreamEntry]:
    return [(sid if isinstance(sid, bytes) else str(sid).encode(), fields or {})
            for sid, fields in reply or ()]


def op_follow(p: int, after: str, block_ms: int, count: int) -> Op[list[StreamEntry]]:
    """Partition ``p``'s events-stream entries after ``after``, waiting up to ``block_ms`` for
    the first (XREAD BLOCK: an empty list when none came)."""
    (reply,) = yield Commands([cmd("xread", {keys.events(p): after}, count=count,
                                   block=block_ms)])
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3
        return _entries(next(iter(reply.values()))[0] if reply else [])
    return _entries(reply[0][1])


def op_entries_from(p: int, start: str, count: int) -> Op[list[StreamEntry]]:
    """Partition ``p``'s events-stream entries from ``start`` on (inclusive), oldest first."""
    (reply,) = yield Commands([cmd("xrange", keys.events(p), min=start, max="+", count=count)])
    return _entries(reply)


__all__ = ["Claimed", "Consumer", "RawEntry", "StreamEntry", "StreamLag", "arecent",
           "events_group", "op_entries_from", "op_first_ids", "op_follow", "op_read_lag",
           "op_recent", "op_tops", "recent", "trim_point"]
