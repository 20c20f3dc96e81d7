"""How far the archive is behind the engine: events waiting in Redis, and the oldest one's age.

Read from the archivers' consumer group alone (no archiver state), so an API status route, a
dashboard or a test can ask too.  An event counts as waiting until an archiver acknowledges it,
which it does only after the store committed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rsched.core.wire import as_text, parse_sid
from rsched.rdb import event_streams
from rsched.rdb.ops import Op, run
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
    applied_until_ms: int = 0
    """Every event appended before this time (Redis's clock: the oldest waiting one's, else
    the time read) is archived, and applied to the job index in the same transaction."""


def unarchived(group: dict[str, Any] | None, length: int, pending: int) -> int:
    """Entries of one events stream not archived yet: read by an archiver and not acknowledged
    (``pending``), plus read by none: the group's lag, or the stream's length (XLEN) where Redis
    does not know it (after deletions in the middle of the stream) or no group exists yet."""
    if group is None:
        return length
    unread = group.get("lag")
    return pending + (length if unread is None else int(unread))


def archive_lag(r: Redis, partitions: int) -> Lag:
    """Two pipelined round trips for all partitions."""
    return run(r, op_archive_lag(partitions))


def op_archive_lag(partitions: int) -> Op[Lag]:
    """The lag, as an operation either client runs."""
    now_ms, streams = yield from event_streams.op_read_lag(partitions)
    oldest: dict[int, int] = {}
    counts: dict[int, int] = {}
    total_pending = 0
    probe: list[tuple[int, str]] = []  # partitions whose oldest waiting entry is undelivered
    for p, (g, n_pending, oldest_pending, length) in enumerate(streams):
        counts[p] = unarchived(g, length, n_pending)
        if g is None:
            if length:
                probe.append((p, "-"))
            continue
        undelivered = counts[p] - n_pending
        total_pending += n_pending
        if oldest_pending is not None:
            oldest[p] = parse_sid(oldest_pending)[0]
        elif undelivered:
            probe.append((p, "(" + as_text(g["last-delivered-id"])))
    if probe:
        for p, sid in (yield from event_streams.op_first_ids(probe)).items():
            oldest[p] = parse_sid(sid)[0]
    age = max((now_ms - min(oldest.values())) / 1000, 0.0) if oldest else 0.0
    return Lag(sum(counts.values()), age, total_pending, counts,
               min(oldest.values()) if oldest else now_ms)


__all__ = ["Lag", "archive_lag", "op_archive_lag", "unarchived"]
