"""The cluster's status (partitions, dispatchers, workers, queues) and the metrics' cluster view,
read from Redis in a few pipelined round trips and returned as rsched.core.views values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rsched.archive.lag import Lag, archive_lag, events_group, unarchived
from rsched.core.views import (
    LAG_BUCKETS_S,
    Cluster,
    DispatcherStatus,
    HandlerWait,
    PartitionCounters,
    PartitionStatus,
    QueueDepth,
    Status,
    WorkerStatus,
    dead_after_ms,
    forgotten,
    worker_record,
)
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.connect import connect
from rsched.rdb.ops import Commands, Op, cmd
from rsched.rdb.redis_api import RedisError
from rsched.service.context import Service

_PER_PARTITION = 6  # commands op_status sends per partition



def _partition_cmds(p: int, now: int) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    return [
        cmd("hmget", keys.lease(p), "owner", "expires_ms", "fence"),
        cmd("zcount", keys.due(p), "-inf", now + 0.5),
        cmd("zrange", keys.due(p), 0, 0, withscores=True),
        cmd("zcount", keys.retry(p), "-inf", now),
        cmd("zcard", keys.dead(p)),
        cmd("smembers", keys.queues(p)),
    ]


def op_status(svc: Service) -> Op[Status]:
    """Partitions, dispatchers, workers, queues, runs waiting for a handler and dead letters
    in two pipelined round trips."""
    P = yield from svc.op_partitions()
    now = yield from svc.op_now()
    cmds = [cmd("zrange", keys.dispatchers(), 0, -1, withscores=True),
            cmd("hgetall", keys.workers())]
    for p in range(P):
        cmds += _partition_cmds(p, now)
    res = yield Commands(cmds)
    members = {as_text(d): int(exp) for d, exp in res[0]}
    held: dict[str, list[int]] = {d: [] for d in members}
    partitions: list[PartitionStatus] = []
    streams: list[tuple[str, str]] = []
    for p in range(P):
        (owner, expires, fence), due, head, retry, dead, queues = \
            res[2 + _PER_PARTITION * p:][:_PER_PARTITION]
        expires_ms = int(expires or 0)
        live = bool(owner) and expires_ms > now
        if live and as_text(owner) in held:
            held[as_text(owner)].append(p)
        oldest = int(head[0][1]) if head else None
        partitions.append(PartitionStatus(
            partition=p, owner=as_text(owner) if live else None,
            lease_expires_ms=expires_ms if live else None, fence=int(fence or 0),
            due_backlog=int(due), retry_backlog=int(retry),
            oldest_due_age_ms=max(now - oldest, 0) if oldest is not None and due else 0,
            dead_letters=int(dead),
        ))
        streams += [(as_text(q), keys.stream(p, as_text(q))) for q in sorted(queues)]
    depth = yield Commands(
        [c for _, s in streams for c in (cmd("xlen", s), cmd("xpending", s, keys.GROUP),
                                          cmd("xinfo_consumers", s, keys.GROUP))],
        raise_on_error=False,
    )
    workers = _workers(res[1], now)
    totals: dict[str, list[int]] = {}
    aside: dict[tuple[str, str], int] = {}
    for i, (q, _) in enumerate(streams):
        length, pending, consumers = depth[3 * i: 3 * i + 3]
        agg = totals.setdefault(q, [0, 0])
        agg[0] += length if isinstance(length, int) else 0
        agg[1] += int(pending["pending"]) if isinstance(pending, dict) else 0
        for name, n in _set_aside(consumers):
            aside[(q, name)] = aside.get((q, name), 0) + n
    workers = _workers(res[1], now)
    return Status(
        now_ms=now, partitions=tuple(partitions),
        dispatchers=tuple(DispatcherStatus(d, exp, tuple(held[d])) for d, exp in members.items()),
        workers=tuple(workers),
        queues=tuple(QueueDepth(q, n, pend, sum(w.alive and q in w.queues for w in workers))
                     for q, (n, pend) in sorted(totals.items())),
        waiting=tuple(HandlerWait(q, t, n, any(w.serves(t, q) for w in workers))
                      for (q, t), n in sorted(aside.items())),
    )


def _set_aside(consumers: Any) -> list[tuple[str, int]]:
    """(job type, runs) held by the consumers of runs set aside for want of a handler
    (lua/park.lua), from a stream's XINFO CONSUMERS."""
    if not isinstance(consumers, list):
        return []
    out = []
    for c in consumers:
        name, n = as_text(c.get("name", b"")), int(c.get("pending") or 0)
        if name.startswith(keys.PARKED_CONSUMER) and n:
            out.append((name[len(keys.PARKED_CONSUMER):], n))
    return out


def _workers(raw: dict[bytes, bytes], now: int) -> list[WorkerStatus]:
    out = []
    for wid, blob in sorted(raw.items()):
        rec = worker_record(blob)
        if forgotten(rec, now):
            continue
        beat = int(rec["beat_ms"])
        dead_at = beat + dead_after_ms(rec)
        alive = now < dead_at
        out.append(WorkerStatus(
            id=as_text(wid), queues=tuple(str(q) for q in rec.get("queues") or []),
            inflight=int(rec.get("inflight") or 0),
            concurrency=int(rec.get("concurrency") or 0),
            host=str(rec.get("host") or ""), pid=int(rec.get("pid") or 0),
            last_heartbeat_ms=beat, alive=alive,
            types=tuple(str(t) for t in rec.get("types") or []),
            dead_since_ms=None if alive else dead_at,
            handler_wait_ms=int(rec["handler_wait_ms"]) if rec.get("handler_wait_ms") else None,
        ))
    return out


def op_workers(svc: Service) -> Op[list[WorkerStatus]]:
    """The registered workers alone (one round trip): what `rsched jobs add` checks a new
    job's type against."""
    now = yield from svc.op_now()
    (raw,) = yield Commands([cmd("hgetall", keys.workers())])
    return _workers(raw, now)


# --- the metrics' cluster view -------------------------------------------------------------------


def _counters(p: int, stats: Any, length: Any, groups: Any) -> PartitionCounters:
    group = events_group(groups)
    pending = int(group.get("pending") or 0) if group else 0
    return PartitionCounters(
        partition=p,
        stats={as_text(k): int(v) for k, v in stats.items()} if isinstance(stats, dict) else {},
        archiver_lag=unarchived(group, length if isinstance(length, int) else 0, pending),
        archiver_pending=pending,
    )


def op_cluster(svc: Service) -> Op[Cluster]:
    """The status plus what only metrics show: each partition's counters, the archiver's lag,
    the runs started (workers add them to the partitions' stats) and the start-lag buckets live
    workers report."""
    status = yield from op_status(svc)
    cmds = [cmd("hgetall", keys.workers())]
    for pt in status.partitions:
        p = pt.partition
        cmds += [cmd("hgetall", keys.stats(p)), cmd("xlen", keys.events(p)),
                 cmd("xinfo_groups", keys.events(p))]
    res = yield Commands(cmds, raise_on_error=False)
    counters = tuple(_counters(pt.partition, *res[1 + 3 * i: 4 + 3 * i])
                     for i, pt in enumerate(status.partitions))
    live = {w.id for w in status.workers if w.alive}
    reports = []
    for wid, raw in (res[0] if isinstance(res[0], dict) else {}).items():
        metrics = worker_record(raw).get("metrics") if as_text(wid) in live else None
        if isinstance(metrics, dict):
            reports.append(metrics)
    lag = [0.0] * (len(LAG_BUCKETS_S) + 2)
    for m in reports:
        counts = m.get("lag") or ()
        if len(counts) == len(lag):
            lag = [a + b for a, b in zip(lag, counts, strict=True)]
    return Cluster(status, counters, sum(pc.stats.get("started", 0) for pc in counters),
                   tuple(lag))


def archive_lag_reader(redis_url: str) -> Callable[[], Lag | None]:
    """What an archiver's metrics port reads at each scrape: the archive's lag, None while
    Redis is away (the scrape still answers with the process's own metrics)."""
    r = connect(redis_url, socket_timeout=5)

    def read() -> Lag | None:
        try:
            return archive_lag(r, int(r.hget(keys.config(), "partitions") or 0))
        except RedisError:
            return None

    return read
