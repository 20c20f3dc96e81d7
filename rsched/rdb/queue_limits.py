"""Queue-wide limits in Redis (docs/limits.md): the definitions (``keys.queue_limits_index``,
and a copy on each queue's own slot), the permit calls a worker makes (lua/queue_permit.lua)
and the wake of waiting runs in their partitions (lua/queue_wake.lua)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from rsched.core import defaults
from rsched.core.limits import Limit
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, Scripts, cmd
from rsched.rdb.scripts import Call

TAKE, KEEP, GIVE, RESERVE = "t", "k", "g", "p"


class PermitOp(NamedTuple):
    """One operation of lua/queue_permit.lua: op, run id, worker id, partition."""

    op: str
    run_id: str
    worker: str
    partition: int | str


def queue_permit(queue: str, ops: Sequence[PermitOp], ttl_ms: int, now_ms: int = 0) -> Call:
    """lua/queue_permit.lua on ``queue``'s slot: these operations in order (``now_ms`` 0:
    Redis's clock)."""
    args: list[Any] = [now_ms, ttl_ms, defaults.QUEUE_RESERVE_MS, defaults.QUEUE_RECHECK_MS,
                       defaults.QUEUE_RECHECK_LATER_MS]
    for o in ops:
        args += [o.op, o.run_id, o.worker, o.partition]
    return ("queue_permit", [keys.queue_limit(queue), keys.queue_permits(queue),
                             keys.queue_limit_log(queue), keys.queue_limit_waiting(queue),
                             keys.queue_limit_told(queue)], args)


class PermitReply(NamedTuple):
    results: list[int]  # one per operation (see the script's header)
    wake: list[tuple[int, str]]  # (partition, run id) of waiting runs given a reservation


def permit_reply(raw: Sequence[Any], n: int) -> PermitReply:
    """The script's reply to ``n`` operations."""
    wake = []
    for w in raw[n:]:
        p, _, run_id = as_text(w).partition(" ")
        wake.append((int(p), run_id))
    return PermitReply([int(v) for v in raw[:n]], wake)


def op_permit(queue: str, ops: Sequence[PermitOp], ttl_ms: int, now_ms: int = 0
              ) -> Op[PermitReply]:
    """lua/queue_permit.lua's operations as one step (the worker sends its own calls)."""
    (raw,) = yield Scripts([queue_permit(queue, ops, ttl_ms, now_ms)])
    if isinstance(raw, Exception):
        raise raw
    return permit_reply(raw, len(ops))


def queue_wake(p: int, run_ids: Sequence[str]) -> Call:
    """lua/queue_wake.lua on partition ``p``: these waiting runs due now."""
    return ("queue_wake", [keys.retry(p)], [0, *run_ids])


def wake_calls(wake: Sequence[tuple[int, str]]) -> list[Call]:
    """The queue_wake calls for runs given a reservation, one per partition."""
    by_part: dict[int, list[str]] = defaultdict(list)
    for p, run_id in wake:
        by_part[p].append(run_id)
    return [queue_wake(p, ids) for p, ids in by_part.items()]


def op_wake(wake: Sequence[tuple[int, str]]) -> Op[int]:
    """Make runs given a reservation due now; how many were."""
    if not wake:
        return 0
    replies = yield Scripts(wake_calls(wake))
    return sum(int(r) for r in replies if not isinstance(r, Exception))


def op_write_queue_limit(queue: str, packed: str) -> Op[int]:
    """Write (``packed`` '' deletes) a queue's limit: the index, then its slot's copy, then a
    reservation for waiting runs the change lets start (all of them once it is deleted), made
    due now.  Safe to repeat.  Returns how many waiting runs it woke."""
    if packed:
        writes = [cmd("hset", keys.queue_limits_index(), queue, packed),
                  cmd("set", keys.queue_limit(queue), packed)]
    else:
        writes = [cmd("hdel", keys.queue_limits_index(), queue),
                  # DEL itself, a key at a time: redis-py's cluster client sends any delete()
                  # through a pipeline of its own (deprecated arguments on redis-py 6.0).
                  cmd("execute_command", "DEL", keys.queue_limit(queue)),
                  cmd("execute_command", "DEL", keys.queue_limit_told(queue))]
    yield Commands(writes[:1], durable=True)
    yield Commands(writes[1:], durable=True)
    (raw,) = yield Scripts([queue_permit(queue, [PermitOp(RESERVE, "", "", "")], 0)],
                           durable=True)
    if isinstance(raw, Exception):
        raise raw
    return (yield from op_wake(permit_reply(raw, 1).wake))


def op_queue_limit(queue: str) -> Op[Limit | None]:
    """The queue's limit (None: none)."""
    (raw,) = yield Commands([cmd("hget", keys.queue_limits_index(), queue)])
    return None if raw is None else Limit.unpacked(queue, as_text(raw))


def op_queue_limits() -> Op[dict[str, Limit]]:
    """Every queue's limit, by queue (what workers read)."""
    (raw,) = yield Commands([cmd("hgetall", keys.queue_limits_index())])
    return {as_text(k): Limit.unpacked(as_text(k), as_text(v)) for k, v in raw.items()}


def op_queue_counts(queue: str, now_ms: int) -> Op[tuple[int, int]]:
    """(permits and reservations held now, runs waiting) of a queue's limit."""
    counts = yield from op_queues_counts([queue], now_ms)
    return counts[queue]


def op_queues_counts(queues: Sequence[str], now_ms: int) -> Op[dict[str, tuple[int, int]]]:
    """Per queue, (permits and reservations held now, runs waiting) of its limit: two reads on
    each queue's slot, all in one pipeline (one round trip per master on a cluster)."""
    if not queues:
        return {}
    raw = yield Commands([c for q in queues for c in (
        cmd("zcount", keys.queue_permits(q), f"({now_ms}", "+inf"),
        cmd("zcard", keys.queue_limit_waiting(q)))])
    return {q: (int(raw[2 * i]), int(raw[2 * i + 1])) for i, q in enumerate(queues)}


__all__ = ["GIVE", "KEEP", "RESERVE", "TAKE", "PermitOp", "PermitReply", "op_permit",
           "op_queue_counts", "op_queues_counts",
           "op_queue_limit", "op_queue_limits", "op_wake", "op_write_queue_limit",
           "permit_reply", "queue_permit", "queue_wake", "wake_calls"]
