"""The streams' bounds: trim_streams.lua's call (KEYS and ARGV in the order of its header) and its
reply, and the read of each partition's queues it needs.  Which partitions to trim, and when, is
the dispatcher's (rsched.engine.dispatcher.trimmer)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.scripts import Call


async def queues_of(r: Any, partitions: Iterable[int]) -> dict[int, list[str]]:
    """Each partition's queue names (SMEMBERS rsched:{pN}:queues), one round trip."""
    parts = list(partitions)
    pipe = r.pipeline(transaction=False)
    for p in parts:
        pipe.smembers(keys.queues(p))
    replies = await pipe.execute()
    return {p: sorted(as_text(q) for q in names) for p, names in zip(parts, replies, strict=True)}


def call(p: int, queues: Collection[str], keep: int, keep_ms: int, now_ms: int = 0) -> Call:
    """Trim partition ``p``'s streams: its ``queues``' acknowledged entries, and its events
    stream to what its consumer groups have read, or without any to ``keep`` entries and none
    older than ``keep_ms`` (0: no such bound); ``now_ms`` 0: Redis TIME."""
    return ("trim_streams", [keys.events(p), *(keys.stream(p, q) for q in queues)],
            [keep, keep_ms, now_ms, keys.GROUP])


class Trimmed(NamedTuple):
    """trim_streams.lua's reply."""

    entries: int  # entries removed
    groups: int  # consumer groups reading the stream (0: trimmed to the bounds)


def trimmed(reply: Any) -> Trimmed:
    """Parse trim_streams.lua's reply."""
    return Trimmed(int(reply[0]), int(reply[1]))
