"""Background operations in Redis: each one a hash under a lease (lua/operation_step.lua,
lua/operation_cancel.lua), an index of every id (a sorted set read by id, newest first: ids are
ULIDs) and the set of those still running, which an API process's runner resumes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from rsched.core.codes import OperationCancel, OperationStep
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, Scripts, cmd, one
from rsched.rdb.scripts import Call

_NOW = 0  # now_ms: Redis TIME


class StepReply(NamedTuple):
    code: OperationStep
    fence: int


def step(op_id: str, owner: str, fence: int, lease_ms: int, end_status: str, keep_ms: int,
         fields: Mapping[str, Any]) -> Call:
    """lua/operation_step.lua: take (``fence`` 0) or keep the operation's lease, setting
    ``fields``; ``end_status`` 'succeeded' or 'failed' ends it ('' keeps it running)."""
    pairs = [x for kv in fields.items() for x in kv]
    return ("operation_step", [keys.operation(op_id)],
            [owner, fence, lease_ms, _NOW, end_status, keep_ms, len(fields), *pairs])


def cancel(op_id: str, keep_ms: int, who: str) -> Call:
    """lua/operation_cancel.lua."""
    return ("operation_cancel", [keys.operation(op_id)], [_NOW, keep_ms, who])


def op_step(op_id: str, owner: str, fence: int, lease_ms: int, end_status: str, keep_ms: int,
            fields: Mapping[str, Any]) -> Op[StepReply]:
    code, held = one((yield Scripts([step(op_id, owner, fence, lease_ms, end_status, keep_ms,
                                          fields)], durable=True)))
    return StepReply(OperationStep(int(code)), int(held))


def op_cancel(op_id: str, keep_ms: int, who: str) -> Op[tuple[OperationCancel, str]]:
    code, status = one((yield Scripts([cancel(op_id, keep_ms, who)], durable=True)))
    return OperationCancel(int(code)), as_text(status)


def op_create(op_id: str, fields: Mapping[str, Any]) -> Op[None]:
    """Store a new operation (status running, no owner yet), index it and mark it running."""
    pairs = {"status": "running", "owner": "", "fence": 0, "lease_ms": 0, **fields}
    yield Commands([cmd("hset", keys.operation(op_id), mapping=pairs),
                    cmd("zadd", keys.operations(), {op_id: 0}),
                    cmd("sadd", keys.operations_running(), op_id)], durable=True)


def op_read(op_ids: Sequence[str]) -> Op[list[dict[str, str]]]:
    """Each operation's hash as text ({} for one that has expired)."""
    if not op_ids:
        return []
    got = yield Commands([cmd("hgetall", keys.operation(i)) for i in op_ids])
    return [{as_text(k): as_text(v) for k, v in h.items()} for h in got]


def op_ids_before(before: str | None, count: int) -> Op[list[str]]:
    """Up to ``count`` operation ids, newest first, older than ``before`` (None: the newest)."""
    top = "+" if before is None else f"({before}"
    (found,) = yield Commands([cmd("zrevrangebylex", keys.operations(), top, "-",
                                   start=0, num=count)])
    return [as_text(v) for v in found]


def op_forget(op_ids: Sequence[str]) -> Op[None]:
    """Drop ids from the index (their hashes have expired)."""
    if op_ids:
        yield Commands([cmd("zrem", keys.operations(), *op_ids)])


def op_running() -> Op[list[str]]:
    """Ids of the operations marked running."""
    (found,) = yield Commands([cmd("smembers", keys.operations_running())])
    return sorted(as_text(v) for v in found)


def op_unmark_running(op_ids: Sequence[str]) -> Op[None]:
    """Take ended (or expired) operations out of the running set."""
    if op_ids:
        yield Commands([cmd("srem", keys.operations_running(), *op_ids)])


def op_dead_totals(partitions: int, top: int | None) -> Op[int]:
    """How many dead letters there are (dead by ``top`` ms, when given): a purge's total."""
    hi = "+inf" if top is None else top
    got = yield Commands([cmd("zcount", keys.dead(p), "-inf", hi) for p in range(partitions)])
    return sum(int(n) for n in got)


def op_deleted(partitions: int, op_id: str) -> Op[int]:
    """How many dead letters the purge ``op_id`` has deleted, counted by lua/delete_dead.lua."""
    got = yield Commands([cmd("hget", keys.op_counts(p), op_id) for p in range(partitions)])
    return sum(int(n) for n in got if n)


__all__ = ["StepReply", "cancel", "op_cancel", "op_create", "op_dead_totals", "op_deleted",
           "op_forget", "op_ids_before", "op_read", "op_running", "op_step", "op_unmark_running",
           "step"]
