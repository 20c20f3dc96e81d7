"""What the read side reports about the cluster, as typed values: the service builds them, the
API and the CLI turn them into JSON or tables, metrics into Prometheus families.  Times are
integer milliseconds here; each face formats them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from rsched.core import defaults

# When a run was meant to start -> its start, in seconds: a healthy cluster starts runs in
# milliseconds.  The bounds of Cluster.start_lag and of each worker's start-lag histogram
# (rsched.obs.metrics).
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    partition: int
    owner: str | None  # the dispatcher holding a live lease; None when free or expired
    lease_expires_ms: int | None  # None when no live lease
    fence: int
    due_backlog: int  # jobs due now, not dispatched yet
    retry_backlog: int  # retries due now
    oldest_due_age_ms: int  # 0 when nothing is due
    dead_letters: int


@dataclass(frozen=True, slots=True)
class DispatcherStatus:
    id: str
    expires_ms: int  # its membership ends unless it renews
    partitions: tuple[int, ...]  # the partitions it holds a live lease on


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    id: str
    queues: tuple[str, ...]
    inflight: int
    concurrency: int
    host: str
    pid: int
    last_heartbeat_ms: int | None
    alive: bool  # heard from within its --dead-after (views.liveness)
    types: tuple[str, ...] = ()  # job types it has handlers for
    dead_since_ms: int | None = None  # not alive: when its heartbeats stopped counting
    handler_wait_ms: int | None = None  # how long it lets runs it has no handler for wait

    def serves(self, job_type: str, queue: str) -> bool:
        """Alive, reading ``queue``, with a handler for ``job_type``."""
        return self.alive and queue in self.queues and job_type in self.types


def worker_record(blob: bytes | str) -> dict[str, Any]:
    """A worker's heartbeat record (msgpack); empty when it cannot be read (a foreign or torn
    write)."""
    try:
        rec = msgpack.unpackb(blob, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData):
        return {}
    return rec if isinstance(rec, dict) else {}


def dead_after_ms(rec: dict[str, Any]) -> int:
    """How long after its last record beat a worker's record is taken for stale: its missed
    record beats (which worker serves what; forgetting records).  Whether it is alive is
    ``liveness``, by its process heartbeat."""
    every = rec.get("heartbeat_ms")
    every = every if isinstance(every, int) and every > 0 else defaults.HEARTBEAT_MS
    return defaults.WORKER_DEAD_AFTER_BEATS * every


class Liveness(NamedTuple):
    alive: bool
    last_beat_ms: int  # its latest sign of life: the record's beat or the process heartbeat
    dead_since_ms: int | None  # not alive: from when


def liveness(rec: dict[str, Any], beat_ms: int | None, now: int) -> Liveness:
    """Whether a worker is alive, by its process heartbeat (``beat_ms``, lua/alive.lua: every
    third of its --dead-after; 0: marked dead; None: none yet, or forgotten once its runs were
    taken over) where its record names its dead-after, else by its record's own beats: the same
    judgement that hands its runs to other workers."""
    record_beat = int(rec["beat_ms"])
    dead_after = rec.get("dead_after_ms")
    if not isinstance(dead_after, int) or dead_after <= 0:
        dead_at = record_beat + dead_after_ms(rec)
        return Liveness(now < dead_at, record_beat, None if now < dead_at else dead_at)
    if beat_ms == 0:  # it left with runs pending, or its supervisor saw it die
        return Liveness(False, record_beat, record_beat)
    last = max(record_beat, beat_ms or 0)
    dead_at = last + dead_after
    return Liveness(now < dead_at, last, None if now < dead_at else dead_at)


def forgotten(rec: dict[str, Any], now: int) -> bool:
    """A record of a worker dead for longer than WORKER_FORGET_MS (or unreadable): not listed,
    and a live worker's prune deletes it."""
    beat = rec.get("beat_ms")
    return not isinstance(beat, int) or (
        now - beat > dead_after_ms(rec) + defaults.WORKER_FORGET_MS)



@dataclass(frozen=True, slots=True)
class QueueDepth:
    queue: str
    length: int  # stream entries over all partitions
    pending: int  # delivered to a worker, not acknowledged yet
    live_workers: int = 0  # live workers that read it

    @property
    def unserved(self) -> bool:
        """Runs wait in it and no live worker reads it."""
        return self.length > 0 and self.live_workers == 0


@dataclass(frozen=True, slots=True)
class HandlerWait:
    """Runs of a job type on a queue that workers without its handler set aside, waiting for
    one that has it (docs/workers.md, "Job types and shared queues")."""

    queue: str
    type: str
    runs: int
    served: bool  # a live worker with the handler reads the queue: it takes them soon


@dataclass(frozen=True, slots=True)
class Status:
    """GET /status and `rsched status`: one reading of every partition, member and queue."""

    now_ms: int
    partitions: tuple[PartitionStatus, ...]
    dispatchers: tuple[DispatcherStatus, ...]
    workers: tuple[WorkerStatus, ...]
    queues: tuple[QueueDepth, ...]  # by name
    waiting: tuple[HandlerWait, ...] = ()  # by queue and type

    @property
    def due_backlog(self) -> int:
        return sum(p.due_backlog for p in self.partitions)

    @property
    def dead_letters(self) -> int:
        return sum(p.dead_letters for p in self.partitions)


@dataclass(frozen=True, slots=True)
class PartitionCounters:
    """What only metrics show of a partition: its counters and the archiver's lag on it."""

    partition: int
    stats: dict[str, int]  # the partition's stats hash: succeeded, dead_lettered, ...
    archiver_lag: int  # events-stream entries not archived yet
    archiver_pending: int  # read by an archiver, not committed yet


@dataclass(frozen=True, slots=True)
class LimitCounts:
    """One limit definition's counts for the metrics (by name, never by key)."""

    name: str
    waiting: int  # runs of its keys waiting now
    deferred: int  # runs that started waiting for it, ever (monotonic)
    in_flight: int = 0  # runs of its keys holding a slot now


@dataclass(frozen=True, slots=True)
class Cluster:
    """The /metrics cluster view: the status, per-partition counters and what live workers
    report in their heartbeats (start-lag bucket counts), and the runs started in the cluster
    (the partitions' ``started`` counts, which workers add to at each heartbeat)."""

    status: Status
    counters: tuple[PartitionCounters, ...]
    runs_started: int
    start_lag: tuple[float, ...]  # per LAG_BUCKETS_S bound, then +Inf, then the sum
    limits: tuple[LimitCounts, ...] = ()  # per definition that has waited or waits
