"""StreamTrimmer: keeps the streams of a dispatcher's partitions within their bounds."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from rsched.engine._calls import CallMany
from rsched.obs import metrics
from rsched.rdb import scripts, stream_bounds


@dataclass(frozen=True, slots=True)
class TrimResult:
    """What one round trimmed."""

    trimmed: int  # entries removed over every partition
    bounded: int  # partitions no consumer group reads, trimmed to keep and keep_ms
    read: int  # partitions an archiver reads, trimmed to what it has read


class StreamTrimmer:
    """Trims each owned partition's streams (lua/trim_streams.lua) once a round: the events
    stream to what the archivers have read, or without an archiver to ``keep`` entries and
    ``keep_ms`` of age; the queue streams to what the workers have acknowledged.  A round is two
    round trips (the queues, then one call per partition), outside the claim's hot path."""

    def __init__(self, r: object, keep: int, keep_ms: int,
                 clock: Callable[[], int] | None = None,
                 call_many: CallMany = scripts.acall_many) -> None:
        self.r = r
        self.keep = keep
        self.keep_ms = keep_ms
        self.clock = clock  # injected epoch ms (tests); None: Redis's clock
        self.call_many = call_many

    async def run_once(self, partitions: Collection[int]) -> TrimResult:
        """Trim the streams of ``partitions``; what was trimmed."""
        if not partitions:
            return TrimResult(0, 0, 0)
        now = self.clock() if self.clock is not None else 0
        queues = await stream_bounds.queues_of(self.r, sorted(partitions))
        replies = await self.call_many(self.r, [
            stream_bounds.call(p, qs, self.keep, self.keep_ms, now) for p, qs in queues.items()])
        done = [stream_bounds.trimmed(r) for r in replies]
        total = sum(t.entries for t in done)
        if total:
            metrics.EVENTS_TRIMMED.inc(total)
        return TrimResult(total, sum(1 for t in done if t.groups == 0),
                          sum(1 for t in done if t.groups > 0))
