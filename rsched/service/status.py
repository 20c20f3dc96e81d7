"""The cluster's status (partitions, dispatchers, workers, queues) and the metrics' cluster view,
read from Redis in a few pipelined round trips and returned as rsched.core.views values."""

from __future__ import annotations

from collections.abc import Callable

from rsched.archive.lag import Lag, archive_lag, unarchived
from rsched.core.views import (
    Cluster,
    DispatcherStatus,
    HandlerWait,
    LimitCounts,
    PartitionCounters,
    PartitionStatus,
    QueueDepth,
    Status,
    WorkerStatus,
    forgotten,
    liveness,
    worker_record,
)
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.connect import connect
from rsched.rdb.limit_scripts import op_busy_keys, op_limit_deferred
from rsched.rdb.ops import Op
from rsched.rdb.redis_api import RedisError
from rsched.rdb.setup import stored_partitions
from rsched.rdb.status_reads import (
    CountersRead,
    op_read_counters,
    op_read_queues,
    op_read_status,
    op_read_workers,
)
from rsched.rdb.worker_registry import op_start_lag
from rsched.service.context import Service


def op_status(svc: Service) -> Op[Status]:
    """Partitions, dispatchers, workers, queues, runs waiting for a handler and dead letters
    in two pipelined round trips."""
    P = yield from svc.op_partitions()
    now = yield from svc.op_now()
    read = yield from op_read_status(P, now)
    held: dict[str, list[int]] = {d: [] for d in read.dispatchers}
    partitions: list[PartitionStatus] = []
    streams: list[tuple[str, str]] = []
    for p, pr in enumerate(read.partitions):
        live = bool(pr.owner) and pr.lease_expires_ms > now
        if live and pr.owner in held:
            held[pr.owner].append(p)
        oldest = pr.oldest_due_ms
        partitions.append(PartitionStatus(
            partition=p, owner=pr.owner if live else None,
            lease_expires_ms=pr.lease_expires_ms if live else None, fence=pr.fence,
            due_backlog=pr.due, retry_backlog=pr.retry,
            oldest_due_age_ms=max(now - oldest, 0) if oldest is not None and pr.due else 0,
            dead_letters=pr.dead,
        ))
        streams += [(q, keys.stream(p, q)) for q in pr.queues]
    depth = yield from op_read_queues([s for _, s in streams])
    totals: dict[str, list[int]] = {}
    aside: dict[tuple[str, str], int] = {}
    for (q, _), qr in zip(streams, depth, strict=True):
        agg = totals.setdefault(q, [0, 0])
        agg[0] += qr.length
        agg[1] += qr.pending
        for name, n in qr.set_aside:
            aside[(q, name)] = aside.get((q, name), 0) + n
    workers = _workers(read.workers, read.beats, now)
    return Status(
        now_ms=now, partitions=tuple(partitions),
        dispatchers=tuple(DispatcherStatus(d, exp, tuple(held[d]))
                          for d, exp in read.dispatchers.items()),
        workers=tuple(workers),
        queues=tuple(QueueDepth(q, n, pend, sum(w.alive and q in w.queues for w in workers))
                     for q, (n, pend) in sorted(totals.items())),
        waiting=tuple(HandlerWait(q, t, n, any(w.serves(t, q) for w in workers))
                      for (q, t), n in sorted(aside.items())),
    )


def _workers(raw: dict[bytes, bytes], beats: dict[bytes, int], now: int) -> list[WorkerStatus]:
    out = []
    for wid, blob in sorted(raw.items()):
        rec = worker_record(blob)
        if forgotten(rec, now):
            continue
        life = liveness(rec, beats.get(wid), now)
        out.append(WorkerStatus(
            id=as_text(wid), queues=tuple(str(q) for q in rec.get("queues") or []),
            inflight=int(rec.get("inflight") or 0),
            concurrency=int(rec.get("concurrency") or 0),
            host=str(rec.get("host") or ""), pid=int(rec.get("pid") or 0),
            last_heartbeat_ms=life.last_beat_ms, alive=life.alive,
            types=tuple(str(t) for t in rec.get("types") or []),
            dead_since_ms=life.dead_since_ms,
            handler_wait_ms=int(rec["handler_wait_ms"]) if rec.get("handler_wait_ms") else None,
        ))
    return out


def op_workers(svc: Service) -> Op[list[WorkerStatus]]:
    """The registered workers alone (one round trip): what `rsched jobs add` checks a new
    job's type against."""
    now = yield from svc.op_now()
    return _workers(*(yield from op_read_workers()), now)


# --- the metrics' cluster view -------------------------------------------------------------------


def _counters(p: int, read: CountersRead) -> PartitionCounters:
    pending = int(read.group.get("pending") or 0) if read.group else 0
    return PartitionCounters(partition=p, stats=read.stats,
                             archiver_lag=unarchived(read.group, read.events, pending),
                             archiver_pending=pending)


def op_cluster(svc: Service) -> Op[Cluster]:
    """The status plus what only metrics show: each partition's counters, the archiver's lag,
    the runs started (workers add them to the partitions' stats) and the start-lag histogram
    (workers add their observations to it: a dead worker's stay)."""
    status = yield from op_status(svc)
    reads = yield from op_read_counters([pt.partition for pt in status.partitions])
    counters = tuple(_counters(pt.partition, read)
                     for pt, read in zip(status.partitions, reads, strict=True))
    lag = yield from op_start_lag()
    limits = yield from op_limit_view(len(status.partitions))
    return Cluster(status, counters, sum(pc.stats.get("started", 0) for pc in counters),
                   tuple(lag), limits)


def op_limit_view(partitions: int) -> Op[tuple[LimitCounts, ...]]:
    """Per limit definition (never per key): its keys' runs in flight and waiting now, and the
    runs that started waiting for it; keys with no definition count under '' (they run
    unlimited, counted)."""
    deferred = yield from op_limit_deferred(partitions)
    busy = yield from op_busy_keys(range(partitions))
    in_flight: dict[str, int] = {}
    waiting: dict[str, int] = {}
    for k in busy:
        in_flight[k.name] = in_flight.get(k.name, 0) + k.in_flight
        waiting[k.name] = waiting.get(k.name, 0) + k.waiting
    return tuple(LimitCounts(name, waiting.get(name, 0), deferred.get(name, 0),
                             in_flight.get(name, 0))
                 for name in sorted(set(in_flight) | set(deferred)))


def archive_lag_reader(redis_url: str) -> Callable[[], Lag | None]:
    """What an archiver's metrics port reads at each scrape: the archive's lag, None while
    Redis is away (the scrape still answers with the process's own metrics)."""
    r = connect(redis_url, socket_timeout=5)

    def read() -> Lag | None:
        try:
            return archive_lag(r, stored_partitions(r))
        except RedisError:
            return None

    return read
