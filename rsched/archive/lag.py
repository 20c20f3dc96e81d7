"""How far the archive is behind the engine: events waiting in Redis, and the oldest one's age.

Read from the archivers' consumer group alone (no archiver state), so an API status route, a
dashboard or a test can ask too.  An event counts as waiting until an archiver acknowledges it,
which it does only after the store committed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rsched.archive.events import parse_sid
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.redis_api import Redis


@dataclass(frozen=True, slots=True)
class Lag:
    entries: int
    """Events-stream entries in Redis not yet archived: never delivered to an archiver, or
    delivered and not yet acknowledged (one entry may hold several events, see events.expand)."""
    seconds: float
    """Age of the oldest of them by Redis's clock (0 when none waits)."""
    pending: int = 0
    """Delivered to an archiver and not yet acknowledged (in a batch, or held by a dead one)."""
    by_partition: dict[int, int] = field(default_factory=dict)



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


def unarchived(group: dict[str, Any] | None, length: int, pending: int) -> int:
    """Entries of one events stream not archived yet: read by an archiver and not acknowledged
    (``pending``), plus read by none: the group's lag, or the stream's length (XLEN) where Redis
    does not know it (after deletions in the middle of the stream) or no group exists yet."""
    if group is None:
        return length
    unread = group.get("lag")
    return pending + (length if unread is None else int(unread))


def _next_sid(sid: bytes) -> str:
    ms, seq = parse_sid(sid)
    return f"{ms}-{seq + 1}"


def archive_lag(r: Redis, partitions: int) -> Lag:
    """Two pipelined round trips for all partitions."""
    pipe = r.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xinfo_groups(keys.events(p))
        pipe.xpending(keys.events(p), keys.EVENTS_GROUP)
        pipe.xlen(keys.events(p))
    pipe.time()
    res = pipe.execute(raise_on_error=False)
    sec, usec = res[-1]
    now_ms = int(sec) * 1000 + int(usec) // 1000
    oldest: dict[int, int] = {}
    counts: dict[int, int] = {}
    total_pending = 0
    probe: list[tuple[int, str]] = []  # partitions whose oldest waiting entry is undelivered
    for p in range(partitions):
        info, pending, length = res[3 * p : 3 * p + 3]
        if isinstance(length, Exception):
            raise length
        g = events_group(info)
        n_pending = 0 if g is None or isinstance(pending, Exception) else int(pending["pending"])
        counts[p] = unarchived(g, int(length), n_pending)
        if g is None:
            if length:
                probe.append((p, "-"))
            continue
        undelivered = counts[p] - n_pending
        total_pending += n_pending
        if n_pending:
            oldest[p] = parse_sid(pending["min"])[0]
        elif undelivered:
            probe.append((p, "(" + g["last-delivered-id"].decode()))
    if probe:
        pipe = r.pipeline(transaction=False)
        for p, start in probe:
            pipe.xrange(keys.events(p), min=start, count=1)
        for (p, _), first in zip(probe, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(first, list) and first:
                oldest[p] = parse_sid(first[0][0])[0]
    age = max((now_ms - min(oldest.values())) / 1000, 0.0) if oldest else 0.0
    return Lag(sum(counts.values()), age, total_pending, counts)


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


__all__ = ["Lag", "archive_lag", "events_group", "trim_point", "unarchived"]
