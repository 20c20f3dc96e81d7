"""What workers keep in Redis besides their runs: the registry (HASH rsched:workers, worker id
-> packed record, core.views reads it), each partition's ``started`` count, and the counts of
runs set aside per queue and job type (HASH keys.parked(), '["<queue>", "<type>"]' -> count)
that tell the workers with the handler to look."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from rsched.core.wire import as_text
from rsched.rdb import keys


async def register(r: Any, worker_id: str, record: bytes, started: Mapping[int, int]
                   ) -> list[int]:
    """Store the worker's record and add ``started`` (partition -> runs started since the last
    call) to each partition's ``started`` count, in one round trip; returns the partitions
    whose count was added (the others: add them again next time).  A failed record raises."""
    pipe = r.pipeline(transaction=False)  # keys in different slots
    pipe.hset(keys.workers(), worker_id, record)
    for p, n in started.items():
        pipe.hincrby(keys.stats(p), "started", n)
    registered, *added = await pipe.execute(raise_on_error=False)
    if isinstance(registered, Exception):
        raise registered
    return [p for p, res in zip(started, added, strict=True) if not isinstance(res, Exception)]


async def records(r: Any) -> dict[bytes, bytes]:
    """Every worker's record by its id."""
    return await r.hgetall(keys.workers())  # type: ignore[no-any-return]


async def forget(r: Any, worker_ids: Collection[bytes | str]) -> None:
    """Delete these workers' records."""
    await r.hdel(keys.workers(), *worker_ids)


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


__all__ = ["add_parked", "forget", "parked_counts", "parked_name", "parked_of", "records",
           "register"]
