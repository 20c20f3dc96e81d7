"""The reads of a claim round (rsched.engine.dispatcher.claimer): the nodes' clocks with each
owned partition's due and retry entries in one pipeline, and the schedule fields of recurring
jobs; and dropping due-set entries whose job hash is gone.  The claimer decides what is due
and what to claim; this module sends the commands and parses their replies."""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any, NamedTuple

from rsched.core.layout import J
from rsched.rdb import keys
from rsched.rdb.cluster import clock_routes
from rsched.rdb.shared_keys import time_ms

_READS = 5  # sorted-set reads per partition in read_round (due, near, head; retries, head)

# The job-hash fields a recurring job's claim item is computed from (J.type: in every job
# hash, so a job whose hash is gone reads None there), and its active run under an overlap
# policy (lua/claim.lua lets go of one that has ended).
JOB_FIELDS = (J.type, J.next_ms, J.queue, J.cron, J.spec, "active")


class DueRead(NamedTuple):
    """One partition's entries as a round reads them; [member, score] pairs with float scores
    (see `pairs`)."""

    due: list[bytes]  # due-set members due by the clock estimate (read without their scores)
    near: list[Any]  # due-set pairs past the estimate, up to the horizon
    due_head: list[Any]  # the due set's first pair ([]: empty)
    retry: list[Any]  # retry-set pairs (run id, due ms) up to the horizon
    retry_head: list[Any]  # the retry set's first pair ([]: empty)
    queues: list[str]  # the partition's queue names, sorted ([]: not read, or none yet)


class RoundRead(NamedTuple):
    """What `read_round` read: each TIME sent (ms, or its error), per partition the index of
    its node's TIME in ``times``, and its DueRead (or the first error among its reads: its
    cluster master is down)."""

    times: list[int | Exception]
    clock_of: list[int]
    parts: list[DueRead | Exception]


async def read_round(r: Any, parts: Sequence[int], bounds: Sequence[float],
                     horizons: Sequence[int], batch: int, queues_known: Container[int]
                     ) -> RoundRead:
    """The clocks of the nodes holding ``parts`` (one TIME per master: rdb.cluster
    .clock_routes) and, per partition, its due-set members scored up to its ``bounds`` entry
    (without scores: Redis formats each score it sends with printf, a cost the claim can skip),
    those from there to its ``horizons`` entry with their scores, its retries up to it, each
    set's head, and its queues unless ``queues_known`` holds it; at most ``batch`` entries a
    read.  One pipeline."""
    routes, clock_of = clock_routes(r, [keys.due(p) for p in parts])
    pipe = r.pipeline(transaction=False)
    for key in routes:
        if key is None:
            pipe.time()
        else:
            pipe.execute_command("TIME", route_by=key)
    sizes = []
    for p, bound, horizon in zip(parts, bounds, horizons, strict=True):
        due_key = keys.due(p)
        pipe.execute_command("ZRANGEBYSCORE", due_key, "-inf", bound, "LIMIT", 0, batch)
        pipe.execute_command("ZRANGEBYSCORE", due_key, f"({bound}", horizon, "LIMIT", 0,
                             batch, "WITHSCORES")
        pipe.execute_command("ZRANGE", due_key, 0, 0, "WITHSCORES")
        retry_key = keys.retry(p)
        pipe.execute_command("ZRANGEBYSCORE", retry_key, "-inf", horizon, "LIMIT", 0, batch,
                             "WITHSCORES")
        pipe.execute_command("ZRANGE", retry_key, 0, 0, "WITHSCORES")
        if p not in queues_known:
            pipe.smembers(keys.queues(p))
            sizes.append(_READS + 1)
        else:
            sizes.append(_READS)
    res = await pipe.execute(raise_on_error=False)
    times: list[int | Exception] = [t if isinstance(t, Exception) else time_ms(t)
                                    for t in res[:len(routes)]]
    out: list[DueRead | Exception] = []
    i = len(routes)
    for n in sizes:
        chunk = res[i:i + n]
        i += n
        failed = next((x for x in chunk if isinstance(x, Exception)), None)
        if failed is not None:
            out.append(failed)
            continue
        due, near, due_head, ret, ret_head = chunk[:_READS]
        queues = sorted(q.decode() for q in chunk[_READS]) if n > _READS else []
        out.append(DueRead(due, pairs(near), pairs(due_head), pairs(ret), pairs(ret_head),
                           queues))
    return RoundRead(times, clock_of, out)


def pairs(reply: list[Any]) -> list[Any]:
    """A raw ``ZRANGE ... WITHSCORES`` reply as [member, score] pairs.  RESP3 sends them so,
    with float scores; RESP2 (a URL's ``protocol=2``) flat, scores as text.  redis-py's own
    callback turns every RESP3 score back into text and parses it again: the dispatcher's
    largest cost per job in a burst (make bench).  tests/redis/test_dispatch.py compares both."""
    if not reply or isinstance(reply[0], list):
        return reply
    return [[m, float(s)] for m, s in zip(reply[::2], reply[1::2], strict=True)]


async def read_schedules(r: Any, due: Mapping[int, Sequence[tuple[str, float | None]]]
                         ) -> list[tuple[list[Any], float | None]]:
    """Per due job (partition by partition, in order): its JOB_FIELDS as read (raw; the first
    None when its hash is gone) and its due score, read now from the due set when given as
    None (None then: no longer there, claimed or removed meanwhile).  One pipeline."""
    pipe = r.pipeline(transaction=False)
    for p, jobs in due.items():
        for job_id, score in jobs:
            pipe.hmget(keys.job(p, job_id), JOB_FIELDS)
            if score is None:
                pipe.zscore(keys.due(p), job_id)
    replies = iter(await pipe.execute())
    return [(next(replies), next(replies) if score is None else score)
            for jobs in due.values() for _, score in jobs]


async def drop_due(r: Any, entries: Sequence[tuple[int, str]]) -> None:
    """Remove (partition, job id) entries from their due sets (their job hash is gone)."""
    pipe = r.pipeline(transaction=False)
    for p, job_id in entries:
        pipe.zrem(keys.due(p), job_id)
    await pipe.execute()


__all__ = ["JOB_FIELDS", "DueRead", "RoundRead", "drop_due", "pairs", "read_round",
           "read_schedules"]
