"""The schedule script's call (lua/schedule.lua): KEYS and ARGV in the order of its header,
built from prepared jobs, and its reply as a named tuple.

The scheduling hot path builds one such call per chunk of jobs: `call` does the per-job work
the script's argument layout asks for, and nothing more.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rsched.core.layout import J
from rsched.core.models import JobStatus
from rsched.core.spec import OWN_FIELDS, SHARED_FIELDS, Prepared
from rsched.rdb import keys
from rsched.rdb.scripts import Call

_STATUS_AT = SHARED_FIELDS.index(J.status)
_CRON_AT = SHARED_FIELDS.index(J.cron)
_LIMIT_AT = SHARED_FIELDS.index(J.limit_key)
assert OWN_FIELDS == (J.next_ms, J.spec)  # the order `call` writes them in
assert SHARED_FIELDS[:2] == (J.type, J.queue)  # what `call` reports group sizes by


def call(p: int, preps: list[Prepared], now: int, events_maxlen: int
         ) -> tuple[Call, list[int] | None, list[tuple[Any, int]]]:
    """The script call for jobs of partition ``p``, the order it holds them in (indexes
    into ``preps``; None: as they are, one group): grouped by their SHARED_FIELDS values, each
    group's values sent once, and ((type, queue), size) of each group.  A call holds keyed or
    random ids only, so its first job tells which."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, prep in enumerate(preps):
        shared = prep.shared()
        group = groups.get(shared)
        if group is None:
            groups[shared] = [k]
        else:
            group.append(k)
    ks = [keys.due(p), keys.events(p), keys.queues(p), keys.stats(p)]
    job_key = keys.job(p, "")
    keyed = preps[0].body_hash != ""
    args: list[Any] = [0, events_maxlen, keys.GROUP, now, len(preps),
                       len(SHARED_FIELDS), len(OWN_FIELDS), int(keyed),
                       *SHARED_FIELDS, *OWN_FIELDS]
    order: list[int] = []
    streams: dict[str, int] = {}  # queue -> KEYS index (1-based) of its stream, after the jobs
    # next_ms -> its text, which is also the score of a job of priority 0: hiredis writes an int
    # out through str() per argument, and the jobs of a call mostly share their due ms.
    texts: dict[int, str] = {}
    for shared, members in groups.items():
        args.append(len(members))
        # One-off jobs that are due go straight to their queue stream (see lua/schedule.lua),
        # but for those with a limit key: claim.lua admits them.
        if (shared[_CRON_AT] == "" and shared[_STATUS_AT] == JobStatus.SCHEDULED.value
                and shared[_LIMIT_AT] == ""):
            queue = shared[1]
            args.append(streams.setdefault(queue, 4 + len(preps) + len(streams) + 1))
        else:
            args.append(0)
        paused = shared[_STATUS_AT] == JobStatus.PAUSED.value
        scored_at = len(args)  # 0: not indexed (paused), 1: each due at its next_ms, 2: scores
        args.append(0 if paused else 1)
        args += shared
        mark, key_mark = len(args), len(ks)
        # The job's key; its body_hash in a keyed call, its id, then OWN_FIELDS values written
        # out.  No score while each is its job's next_ms.
        for k in members:
            job, blob, body_hash, next_ms, score = preps[k]
            if score != next_ms and not paused:  # a priority, a cron's jitter
                break
            due = texts.get(next_ms)
            if due is None:
                due = texts[next_ms] = str(next_ms)
            ks.append(job_key + job.id)
            if keyed:
                args.append(body_hash)
            args += (job.id, due, blob)
        else:
            order += members
            continue
        # A score that is not its job's next_ms: the group again, each job with its score.
        args[scored_at] = 2
        del args[mark:], ks[key_mark:]
        for k in members:
            job, blob, body_hash, next_ms, score = preps[k]
            ks.append(job_key + job.id)
            if keyed:
                args.append(body_hash)
            args += (score, job.id, str(next_ms), blob)
        order += members
    ks += (keys.stream(p, queue) for queue in streams)
    sizes = [(shared[:2], len(members)) for shared, members in groups.items()]
    return ("schedule", ks, args), order if len(groups) > 1 else None, sizes


class ScheduleReply(NamedTuple):
    """schedule.lua's reply: whether a job created is now the partition's earliest due one
    (wake a dispatcher), the time the script stamped on keyed jobs it created (their
    created_ms), and a ScheduleCode value per job in the call's order."""

    wake: bool
    now_ms: int
    codes: list[int]

    @classmethod
    def of(cls, reply: Any) -> ScheduleReply:
        return cls(reply[0] == 1, int(reply[1]), reply[2:])


__all__ = ["ScheduleReply", "call"]
