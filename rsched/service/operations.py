"""Background operations: a purge of dead letters (or its dry run, which counts) answers at once
with an operation, and a runner works through it in chunks, recording its progress in Redis.

An operation is stored with its request (filter, dry run, the age bound fixed when it started)
and its place: the partition and the last dead letter read there (a keyset cursor: letters
deleted meanwhile shift nothing, lua/dead_page.lua).  It runs under a lease renewed with every
chunk (lua/operation_step.lua), so a runner that dies or stalls is taken over where it left off
by another (an API process looks for such operations every OPERATION_POLL_S); a cancel stops it
at its next chunk.  A purge's ``deleted`` is exact when it ends: each deletion is counted in the
same script call under the operation's id (lua/delete_dead.lua).  ``scanned`` and ``matched``
count the letters read: after a takeover they miss those the previous runner deleted in a chunk
it did not get to record (a dry run deletes nothing, so its counts are exact).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from rsched.core import defaults
from rsched.core.codes import OperationCancel, OperationStep
from rsched.core.cursor import check_limit, decode_cursor, encode_cursor
from rsched.core.errors import Conflict, NotFound
from rsched.core.ids import ulid
from rsched.rdb import operations as store
from rsched.rdb.job_reads import op_dead_oldest
from rsched.rdb.ops import Op
from rsched.rdb.redis_api import RedisError
from rsched.service.context import Service
from rsched.service.dead_letters import PURGE_CHUNK, DeadFilter, op_delete
from rsched.service.jobs import op_read_runs

PURGE = "purgeDeadLetters"
ENDED = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class Operation:
    """One background operation as stored; ``matched`` is a dry run's count, ``deleted`` a
    purge's; ``total`` the dead letters within the age bound when it started."""

    id: str
    kind: str
    status: str  # running | succeeded | failed | cancelled
    dry_run: bool
    filter: dict[str, Any]
    who: str
    created_ms: int
    updated_ms: int | None
    ended_ms: int | None
    total: int
    scanned: int
    matched: int
    deleted: int
    error: str | None
    cancelled_by: str | None
    top: int | None  # the newest dead-letter time taken (the filter's age, fixed at start)
    part: int  # the partition being read
    after: tuple[float, str] | None  # the last letter read there

    @classmethod
    def from_hash(cls, op_id: str, h: dict[str, str]) -> Operation:
        def num(name: str) -> int | None:
            v = h.get(name, "")
            return int(v) if v else None

        after = None
        if h.get("after_id"):
            after = (float(h["after_score"]), h["after_id"])
        return cls(op_id, h.get("kind", PURGE), h["status"], h.get("dry_run") == "1",
                   json.loads(h.get("filter") or "{}"), h.get("who", ""),
                   num("created_ms") or 0, num("updated_ms"), num("ended_ms"),
                   num("total") or 0, num("scanned") or 0, num("matched") or 0,
                   num("deleted") or 0, h.get("error") or None, h.get("cancelled_by") or None,
                   num("top"), num("part") or 0, after)

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def dead_filter(self) -> DeadFilter:
        f = self.filter
        return DeadFilter(f.get("type"), f.get("queue"), f.get("errorContains"),
                          f.get("olderThanSeconds"))

    def progress(self) -> dict[str, Any]:
        """The fields a chunk writes (operation_step.lua sets them under the lease)."""
        score, rid = ("", "") if self.after is None else (repr(self.after[0]), self.after[1])
        return {"scanned": self.scanned, "matched": self.matched, "deleted": self.deleted,
                "part": self.part, "after_score": score, "after_id": rid}


def _filter_json(flt: DeadFilter) -> dict[str, Any]:
    pairs = {"type": flt.type, "queue": flt.queue, "errorContains": flt.error_contains,
             "olderThanSeconds": flt.older_than_s}
    return {k: v for k, v in pairs.items() if v is not None}


def op_start_purge(svc: Service, flt: DeadFilter, dry_run: bool, who: str) -> Op[Operation]:
    """A purge (or dry run) of the dead letters ``flt`` takes, stored and marked running; a
    runner (op_run) does the work.  Its age bound is fixed now."""
    now = yield from svc.op_now()
    top = None if flt.older_than_s is None else int(flt.max_score(now))
    P = yield from svc.op_partitions()
    total = yield from store.op_dead_totals(P, top)
    op_id = ulid(now)
    fields = {"kind": PURGE, "dry_run": "1" if dry_run else "0",
              "filter": json.dumps(_filter_json(flt), separators=(",", ":")), "who": who,
              "created_ms": now, "total": total, "top": "" if top is None else top,
              "scanned": 0, "matched": 0, "deleted": 0, "part": 0}
    yield from store.op_create(op_id, fields)
    return (yield from op_get_operation(op_id))


def op_get_operation(op_id: str) -> Op[Operation]:
    """The operation, NotFound once it has expired (OPERATION_KEEP_MS after it ended)."""
    (h,) = yield from store.op_read([op_id])
    if not h.get("status"):
        raise NotFound("operation", op_id)
    return Operation.from_hash(op_id, h)


def op_list_operations(limit: int = defaults.PAGE_LIMIT, cursor: str | None = None
                       ) -> Op[tuple[list[Operation], str | None]]:
    """A page of operations, newest first, and the cursor of the next (None: the last)."""
    check_limit(limit)
    before = decode_cursor(cursor, lambda v: isinstance(v, str) and v != "")
    out: list[Operation] = []
    while len(out) < limit:
        want = limit - len(out)
        ids = yield from store.op_ids_before(before, want)
        hashes = yield from store.op_read(ids)
        out += [Operation.from_hash(i, h) for i, h in zip(ids, hashes, strict=True)
                if h.get("status")]
        # An ended operation's hash expires (OPERATION_KEEP_MS); its id goes when met here.
        yield from store.op_forget([i for i, h in zip(ids, hashes, strict=True)
                                    if not h.get("status")])
        if len(ids) < want:
            return out, None
        before = ids[-1]
    return out, encode_cursor(before)


def op_cancel_operation(op_id: str, who: str) -> Op[Operation]:
    """Stop a running operation (its runner stops at its next chunk); Conflict if it had
    ended, NotFound if there is no such operation."""
    code, status = yield from store.op_cancel(op_id, defaults.OPERATION_KEEP_MS, who)
    if code is OperationCancel.GONE:
        raise NotFound("operation", op_id)
    if code is OperationCancel.ENDED:
        raise Conflict("status", f"the operation has {status} already")
    yield from store.op_unmark_running([op_id])
    return (yield from op_get_operation(op_id))


def op_run(svc: Service, op_id: str, owner: str,
           lease_ms: int = defaults.OPERATION_LEASE_MS) -> Op[OperationStep]:
    """Take the operation if no live runner holds it and work through it, a chunk of
    PURGE_CHUNK dead letters at a time, until it ends, is cancelled or another runner takes
    it over; answers how it stopped (HELD: it ran to its end here)."""
    keep = defaults.OPERATION_KEEP_MS
    code, fence = yield from store.op_step(op_id, owner, 0, lease_ms, "", keep, {})
    if code is not OperationStep.HELD:
        if code in (OperationStep.ENDED, OperationStep.GONE):
            yield from store.op_unmark_running([op_id])
        return code
    try:
        op = yield from op_get_operation(op_id)
        flt, P = op.dead_filter(), (yield from svc.op_partitions())
        while op.part < P:
            letters = yield from op_dead_oldest(op.part, op.after, op.top, PURGE_CHUNK)
            ids = [rid for rid, _ in letters]
            take = ids
            if flt.reads_runs and ids:
                runs = yield from op_read_runs(ids)
                take = [rid for rid, run in zip(ids, runs, strict=True)
                        if run is not None and flt.matches(run)]
            deleted = 0
            if not op.dry_run and take:
                deleted = sum((yield from op_delete(svc, take, op.who, op_id)))
            done = len(letters) < PURGE_CHUNK
            op = replace(op, scanned=op.scanned + len(ids), matched=op.matched + len(take),
                         deleted=op.deleted + deleted, part=op.part + done,
                         after=None if done else (letters[-1][1], letters[-1][0]))
            code, fence = yield from store.op_step(op_id, owner, fence, lease_ms, "", keep,
                                                   op.progress())
            if code is not OperationStep.HELD:
                return code
    except RedisError:
        raise  # Redis is away: the lease expires and a runner resumes the operation later
    except Exception as e:
        # Nothing a later runner would do better: the operation ends, saying why.
        yield from store.op_step(op_id, owner, fence, lease_ms, "failed", keep,
                                 {"error": f"{type(e).__name__}: {e}"[:1000]})
        yield from store.op_unmark_running([op_id])
        raise
    # The exact count: what each deletion counted under the operation's id, a runner taken
    # over mid-chunk included.
    final = {} if op.dry_run else {"deleted": (yield from store.op_deleted(P, op_id))}
    code, _ = yield from store.op_step(op_id, owner, fence, lease_ms, "succeeded", keep, final)
    yield from store.op_unmark_running([op_id])
    return code


def op_running_ids() -> Op[list[str]]:
    """Ids of the operations not ended yet (a runner resumes those no live lease holds)."""
    return (yield from store.op_running())


def check_operation_id(op_id: str) -> str:
    """A path's operation id: a ULID's 19 characters of its alphabet."""
    if len(op_id) != 19 or not op_id.replace("-", "").replace("_", "").isalnum():
        raise NotFound("operation", op_id[:40])
    return op_id


__all__ = ["ENDED", "PURGE", "Operation", "check_operation_id", "op_cancel_operation",
           "op_get_operation", "op_list_operations", "op_run", "op_running_ids", "op_start_purge"]
