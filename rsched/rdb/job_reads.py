"""The plain-command reads of jobs, runs and dead letters the service makes: each an Op that
sends its commands in one round trip and returns the replies as Python values (hashes as
redis-py gives them: bytes to bytes).  The service turns them into core.models values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rsched.core.layout import OWN, J
from rsched.core.models import job_of_run, partition_of
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.job_scripts import dead_letters, dead_page
from rsched.rdb.ops import Commands, Op, Scripts, cmd, one

Hash = dict[bytes, bytes]


def op_hashes(names: Sequence[str]) -> Op[list[Hash]]:
    """HGETALL of each key ({} for none)."""
    if not names:
        return []
    return (yield Commands([cmd("hgetall", n) for n in names]))  # type: ignore[no-any-return]


def op_job_hash(job_id: str) -> Op[Hash]:
    """The job's hash ({}: no such job)."""
    (h,) = yield from op_hashes([keys.job(partition_of(job_id), job_id)])
    return h


def op_stop_asked(job_key: str, run_id: str) -> Op[bool]:
    """Whether overlap cancelPrevious asked ``run_id`` to stop (its job's field 'cancel'
    names it, lua/include/overlap.lua): read by a worker just before the run's handler would
    start."""
    (asked,) = yield Commands([cmd("hget", job_key, "cancel")])
    return asked is not None and as_text(asked) == run_id


def op_run_hashes(run_ids: Sequence[str]) -> Op[list[tuple[Hash, Hash]]]:
    """Each run's hash and its job's hash (a one-off job's own run keeps its fields there,
    models.run_fields)."""
    names = []
    for rid in run_ids:
        job_id = job_of_run(rid)
        p = partition_of(job_id)
        names += [keys.run(p, rid), keys.job(p, job_id)]
    hashes = yield from op_hashes(names)
    return [(hashes[2 * i], hashes[2 * i + 1]) for i in range(len(run_ids))]


def op_history(p: int, job_id: str, count: int | None) -> Op[list[bytes]]:
    """The newest ``count`` records of the job's history list (JSON, newest first); None: all
    of them (the list is bounded: Settings.history_len)."""
    end = -1 if count is None else count - 1
    (raws,) = yield Commands([cmd("lrange", keys.history(p, job_id), 0, end)])
    return raws  # type: ignore[no-any-return]


def op_dead_scores(p: int, run_ids: Sequence[str]) -> Op[list[float | None]]:
    """When each run was dead-lettered (its dead-set score; None: not a dead letter)."""
    return (yield Commands([cmd("zscore", keys.dead(p), rid)  # type: ignore[no-any-return]
                            for rid in run_ids]))


def _entries(reply: list[Any]) -> list[tuple[str, float]]:
    return [(as_text(rid), score) for rid, score in reply]


def op_dead_newest(partitions: int, limit: int) -> Op[list[tuple[str, float]]]:
    """The newest ``limit`` dead letters of each partition, (run id, score), all together."""
    res = yield Commands([cmd("zrevrange", keys.dead(p), 0, limit - 1, withscores=True)
                          for p in range(partitions)])
    return [e for r in res for e in _entries(r)]


def op_dead_after(partitions: int, after: tuple[float, str] | None, top: int | str | None,
                  count: int) -> Op[list[tuple[str, float]]]:
    """Each partition's next ``count`` dead letters after the letter ``after`` (dead ms, run
    id) in the newest-first order, all together, as (run id, score); without ``after``, from
    the newest or, with ``top``, from those dead by then (ms).  A cursor of letters, not of
    offsets: letters added or deleted meanwhile shift nothing (lua/dead_page.lua)."""
    res = yield Scripts([dead_page(p, after, top, count) for p in range(partitions)])
    return [e for r in res for e in dead_letters(one([r]))]


def op_dead_oldest(p: int, after: tuple[float, str] | None, top: int | None, count: int
                   ) -> Op[list[tuple[str, float]]]:
    """Partition ``p``'s next ``count`` dead letters oldest first after the letter ``after``
    (dead ms, run id; None: from the oldest), only those dead by ``top`` ms when given, as
    (run id, score) (lua/dead_page.lua)."""
    (res,) = yield Scripts([dead_page(p, after, top, count, newest_first=False)])
    return dead_letters(one([res]))


def op_scan_jobs(at: int, count: int, node: int | None = None) -> Op[tuple[int, list[str]]]:
    """One SCAN step over the job keys from cursor ``at`` (on master ``node`` of a cluster):
    the next cursor (0: done) and the job keys found, sorted, each once."""
    on_node = {} if node is None else {"target_node": node}
    ((at, found),) = yield Commands([
        cmd("scan", at, match=keys.job_pattern(), count=count, **on_node)])
    return int(at), sorted({as_text(n) for n in found})


def op_jobs_exist(jobs: Sequence[tuple[int, str]]) -> Op[list[bool]]:
    """Per (partition, job id): whether its hash exists."""
    if not jobs:
        return []
    got = yield Commands([cmd("exists", keys.job(p, job_id)) for p, job_id in jobs])
    return [bool(n) for n in got]


def op_job_filter_fields(names: Sequence[str]) -> Op[list[list[bytes | None]]]:
    """Each job key's status, type and queue (None: the field is not stored)."""
    return (yield Commands([cmd("hmget", n, J.status, J.type, J.queue)  # type: ignore[no-any-return]
                            for n in names]))


def op_latest_runs(jobs: Sequence[tuple[int, str]], history: int
                   ) -> Op[list[tuple[list[Any], list[bytes]]]]:
    """Per (partition, job id): its own run's id, state, ended_ms and started_ms (from the job
    hash, None where not stored) and its newest ``history`` history records."""
    reads = []
    for p, job_id in jobs:
        reads += [cmd("hmget", keys.job(p, job_id), J.own_run, OWN.state, OWN.ended_ms,
                      OWN.started_ms),
                  cmd("lrange", keys.history(p, job_id), 0, history - 1)]
    got = (yield Commands(reads)) if reads else []
    return [(got[2 * i], got[2 * i + 1]) for i in range(len(jobs))]


# As bytes: redis-py passes bytes through, and the archiver sends these for every job it reads.
_INDEX_FIELDS = tuple(n.encode() for n in (
    J.type, J.queue, J.status, J.next_ms, J.created_ms, J.updated_ms, J.last_run_id, J.own_run,
    OWN.state, OWN.ended_ms, OWN.started_ms))
_WITH_SPEC = (*_INDEX_FIELDS, J.spec.encode())


def op_index_reads(jobs: Sequence[tuple[int, str, bool]]) -> Op[list[Hash]]:
    """Per (partition, job id, with spec): what the archive's job index keeps of the job hash,
    as a hash of the fields present ({}: no such job), with the packed spec when asked (for the
    idempotency key); one round trip."""
    names = [_WITH_SPEC if spec else _INDEX_FIELDS for _, _, spec in jobs]
    got = (yield Commands([cmd("hmget", keys.job(p, job_id).encode(), *fields)
                           for (p, job_id, _), fields in zip(jobs, names, strict=True)])
           ) if jobs else []
    return [{n: v for n, v in zip(fields, values, strict=True) if v is not None}
            for fields, values in zip(names, got, strict=True)]


def op_histories(jobs: Sequence[tuple[int, str]], count: int) -> Op[list[list[bytes]]]:
    """Per (partition, job id): the newest ``count`` records of its history list."""
    if not jobs:
        return []
    return (yield Commands([cmd("lrange", keys.history(p, job_id),  # type: ignore[no-any-return]
                                0, count - 1) for p, job_id in jobs]))


def op_run_states(runs: Sequence[tuple[int, str]]) -> Op[list[list[Any]]]:
    """Per (partition, run id): the run hash's state, ended_ms and started_ms."""
    if not runs:
        return []
    return (yield Commands([cmd("hmget", keys.run(p, rid),  # type: ignore[no-any-return]
                                "state", "ended_ms", "started_ms") for p, rid in runs]))


__all__ = ["Hash", "op_dead_newest", "op_dead_oldest", "op_dead_after", "op_dead_scores",
           "op_hashes", "op_histories", "op_history", "op_index_reads", "op_job_filter_fields",
           "op_job_hash", "op_jobs_exist", "op_latest_runs", "op_run_hashes", "op_run_states",
           "op_scan_jobs", "op_stop_asked"]
