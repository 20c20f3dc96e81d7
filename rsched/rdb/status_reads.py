"""The reads behind the cluster's status and the metrics' cluster view: the commands, in a few
pipelined round trips, and their replies as named tuples (rsched.service.status makes views
of them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.event_streams import events_group
from rsched.rdb.ops import Commands, Op, cmd

_PER_PARTITION = 6  # commands op_read_status sends per partition


class PartitionRead(NamedTuple):
    """One partition as the status reads it (now: the time of the read)."""

    owner: str  # the lease's holder as stored ('' for none; live or not, see lease_expires_ms)
    lease_expires_ms: int
    fence: int
    due: int  # due-set entries due by now
    oldest_due_ms: int | None  # the earliest due entry's score (None: the due set is empty)
    retry: int  # retry-set entries due by now
    dead: int
    queues: list[str]  # the queue names in use, sorted


class StatusRead(NamedTuple):
    dispatchers: dict[str, int]  # dispatcher id -> its membership's expiry (ms)
    workers: dict[bytes, bytes]  # the workers' registry: id -> record (core.views.worker_record)
    partitions: list[PartitionRead]
    beats: dict[bytes, int]  # the workers' process heartbeats: id -> last beat (ms; 0: dead)


def _partition_cmds(p: int, now: int) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    return [
        cmd("hmget", keys.lease(p), "owner", "expires_ms", "fence"),
        cmd("zcount", keys.due(p), "-inf", now + 0.5),
        cmd("zrange", keys.due(p), 0, 0, withscores=True),
        cmd("zcount", keys.retry(p), "-inf", now),
        cmd("zcard", keys.dead(p)),
        cmd("smembers", keys.queues(p)),
    ]


def op_read_status(partitions: int, now: int) -> Op[StatusRead]:
    """Dispatchers, workers and every partition's lease, backlogs and queues: one round trip."""
    cmds = [cmd("zrange", keys.dispatchers(), 0, -1, withscores=True),
            cmd("hgetall", keys.workers()), _beats_cmd()]
    for p in range(partitions):
        cmds += _partition_cmds(p, now)
    res = yield Commands(cmds)
    out = []
    for p in range(partitions):
        (owner, expires, fence), due, head, retry, dead, queues = \
            res[3 + _PER_PARTITION * p:][:_PER_PARTITION]
        out.append(PartitionRead(
            as_text(owner) if owner else "", int(expires or 0), int(fence or 0), int(due),
            int(head[0][1]) if head else None, int(retry), int(dead),
            sorted(as_text(q) for q in queues)))
    return StatusRead({as_text(d): int(exp) for d, exp in res[0]}, res[1], out, _beats(res[2]))


class QueueRead(NamedTuple):
    """One queue stream: its length, the entries delivered and not acknowledged, and the runs
    set aside for want of a handler (lua/park.lua) as (job type, runs)."""

    length: int
    pending: int
    set_aside: list[tuple[str, int]]


def _set_aside(consumers: Any) -> list[tuple[str, int]]:
    """(job type, runs) held by the consumers of runs set aside, from XINFO CONSUMERS."""
    if not isinstance(consumers, list):
        return []
    out = []
    for c in consumers:
        name, n = as_text(c.get("name", b"")), int(c.get("pending") or 0)
        if name.startswith(keys.PARKED_CONSUMER) and n:
            out.append((name[len(keys.PARKED_CONSUMER):], n))
    return out


def op_read_queues(streams: Sequence[str]) -> Op[list[QueueRead]]:
    """Each queue stream's QueueRead (0 and none for a stream or group not there yet)."""
    depth = yield Commands(
        [c for s in streams for c in (cmd("xlen", s), cmd("xpending", s, keys.GROUP),
                                      cmd("xinfo_consumers", s, keys.GROUP))],
        raise_on_error=False,
    )
    out = []
    for i in range(len(streams)):
        length, pending, consumers = depth[3 * i: 3 * i + 3]
        out.append(QueueRead(length if isinstance(length, int) else 0,
                             int(pending["pending"]) if isinstance(pending, dict) else 0,
                             _set_aside(consumers)))
    return out


def _beats_cmd() -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return cmd("zrange", keys.alive(), 0, -1, withscores=True)


def _beats(raw: Any) -> dict[bytes, int]:
    return {wid: int(ms) for wid, ms in raw}


def op_read_workers() -> Op[tuple[dict[bytes, bytes], dict[bytes, int]]]:
    """The workers' registry (id -> record, core.views.worker_record) and their process
    heartbeats (id -> last beat in ms, 0: marked dead; lua/alive.lua)."""
    raw, beats = yield Commands([cmd("hgetall", keys.workers()), _beats_cmd()])
    return raw, _beats(beats)


class CountersRead(NamedTuple):
    """A partition's counters hash, its events stream's length and the archivers' group in it
    (None: no group or no stream yet)."""

    stats: dict[str, int]
    events: int
    group: dict[str, Any] | None


def op_read_counters(partitions: Sequence[int]) -> Op[list[CountersRead]]:
    """Each partition's CountersRead, in one round trip; a failed read counts as empty."""
    cmds = []
    for p in partitions:
        cmds += [cmd("hgetall", keys.stats(p)), cmd("xlen", keys.events(p)),
                 cmd("xinfo_groups", keys.events(p))]
    res = yield Commands(cmds, raise_on_error=False)
    out = []
    for i in range(len(partitions)):
        stats, length, groups = res[3 * i: 3 + 3 * i]
        out.append(CountersRead(
            {as_text(k): int(v) for k, v in stats.items()} if isinstance(stats, dict) else {},
            length if isinstance(length, int) else 0, events_group(groups)))
    return out


__all__ = ["CountersRead", "PartitionRead", "QueueRead", "StatusRead", "op_read_counters",
           "op_read_queues", "op_read_status", "op_read_workers"]
