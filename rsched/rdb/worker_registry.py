"""What workers keep in Redis besides their runs: the registry (HASH rsched:workers, worker id
-> packed record, core.views reads it), the process heartbeats (ZSET keys.alive(), lua/alive.lua)
that tell when a worker is dead, each partition's ``started`` count, the cluster's
start-lag histogram (HASH keys.start_lag(), read by read_start_lag), and the counts of
runs set aside per queue and job type (HASH keys.parked(), '["<queue>", "<type>"]' -> count)
that tell the workers with the handler to look."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rsched.core.views import LAG_BUCKETS_S
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, cmd
from rsched.rdb.scripts import Call

DEAD_READ_LIMIT = 100  # dead workers one beat returns at most (the rest: at the next beat)


async def register(r: Any, worker_id: str, record: bytes, started: Mapping[int, int],
                   lag: Sequence[float] = ()) -> tuple[list[int], bool]:
    """Store the worker's record, add ``started`` (partition -> runs started since the last
    call) to each partition's ``started`` count and ``lag`` (the start-lag observations since
    the last call: per bucket, then +Inf, then the sum; zeros are not sent) to the cluster's
    histogram, in one round trip.  Returns the partitions whose count was added (the others:
    add them again next time) and whether the lag was.  A failed record raises."""
    pipe = r.pipeline(transaction=False)  # keys in different slots
    pipe.hset(keys.workers(), worker_id, record)
    for p, n in started.items():
        pipe.hincrby(keys.stats(p), "started", n)
    counts, total = list(lag[:-1]), (lag[-1] if lag else 0.0)
    sent = 0
    for i, seen in enumerate(counts):
        if seen:
            pipe.hincrby(keys.start_lag(), str(i), round(seen))
            sent += 1
    if total:
        pipe.hincrbyfloat(keys.start_lag(), "sum", total)
        sent += 1
    registered, *rest = await pipe.execute(raise_on_error=False)
    if isinstance(registered, Exception):
        raise registered
    added, lagged = rest[:len(started)], rest[len(started):len(started) + sent]
    return ([p for p, res in zip(started, added, strict=True) if not isinstance(res, Exception)],
            not any(isinstance(res, Exception) for res in lagged))


def op_start_lag() -> Op[list[float]]:
    """The cluster's start-lag histogram: per LAG_BUCKETS_S bucket (not cumulative), then +Inf,
    then the sum in seconds; zeros when nothing was added (or the read failed)."""
    (h,) = yield Commands([cmd("hgetall", keys.start_lag())], raise_on_error=False)
    out = [0.0] * (len(LAG_BUCKETS_S) + 2)
    if isinstance(h, dict):
        for k, v in h.items():
            name = as_text(k)
            at = len(out) - 1 if name == "sum" else int(name) if name.isdigit() else -1
            if 0 <= at < len(out):
                out[at] = float(v)
    return out


async def records(r: Any) -> dict[bytes, bytes]:
    """Every worker's record by its id."""
    return await r.hgetall(keys.workers())  # type: ignore[no-any-return]


async def forget(r: Any, worker_ids: Collection[bytes | str]) -> None:
    """Delete these workers' records."""
    await r.hdel(keys.workers(), *worker_ids)


def beat(worker_id: str, dead_after_ms: int) -> Call:
    """lua/alive.lua's call: ``worker_id``'s process heartbeat, by Redis's clock; its reply
    (``dead_of``) names the workers whose last beat is ``dead_after_ms`` old or older."""
    return ("alive", [keys.alive()], [worker_id, 0, dead_after_ms, DEAD_READ_LIMIT])


def dead_of(reply: Any) -> dict[str, int]:
    """The dead workers a reply of ``beat``'s call names, with their last beat (ms; 0: marked
    dead by mark_dead)."""
    it = iter(reply[1:])
    return {as_text(wid): int(beat) for wid, beat in zip(it, it, strict=True)}


def mark_dead(r: Any, worker_id: str) -> Any:
    """Set ``worker_id``'s last beat to 0: live workers take over its runs at their next beat
    (it left with runs pending, or its supervisor saw it die).  With a sync or asyncio client
    (the reply, or an awaitable of it)."""
    return r.zadd(keys.alive(), {worker_id: 0})


async def forget_alive(r: Any, worker_ids: Collection[str]) -> None:
    """Drop these workers from the heartbeats (left, or their runs taken over): a worker
    missing there is never taken over this way (the visibility timeout still applies)."""
    await r.zrem(keys.alive(), *worker_ids)


def parked_name(queue: str, jtype: str) -> str:
    """The field of keys.parked() counting the runs of ``jtype`` on ``queue`` set aside."""
    return json.dumps([queue, jtype])


def parked_of(name: str) -> tuple[str, str] | None:
    """(queue, type) a field of keys.parked() counts (None: not such a field)."""
    try:
        queue, jtype = json.loads(name)
    except (ValueError, TypeError):
        return None
    return queue, jtype


async def add_parked(r: Any, counts: Mapping[tuple[str, str], int]) -> None:
    """Add to the counts of runs set aside, by (queue, type)."""
    pipe = r.pipeline(transaction=False)
    for (queue, jtype), n in counts.items():
        pipe.hincrby(keys.parked(), parked_name(queue, jtype), n)
    await pipe.execute()


async def parked_counts(r: Any) -> dict[str, int]:
    """The counts of runs set aside by field name (see parked_of)."""
    return {as_text(raw): int(n) for raw, n in (await r.hgetall(keys.parked())).items()}


__all__ = ["DEAD_READ_LIMIT", "add_parked", "beat", "dead_of", "forget", "forget_alive",
           "mark_dead", "op_start_lag", "parked_counts", "parked_name", "parked_of", "records",
           "register"]
