"""The schedule script's call (lua/schedule.lua): KEYS and ARGV in the order of its header,
built from prepared jobs, and its reply as a named tuple.

The scheduling hot path builds one such call per chunk of jobs: `call` does the per-job work
the script's argument layout asks for, and nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rsched.core.layout import J
from rsched.core.models import JobStatus
from rsched.core.spec import OWN_FIELDS, SHARED_FIELDS, Dedup, Prepared
from rsched.rdb import keys
from rsched.rdb.scripts import Call

_STATUS_AT = SHARED_FIELDS.index(J.status)
_CRON_AT = SHARED_FIELDS.index(J.cron)
_LIMIT_AT = SHARED_FIELDS.index(J.limit_key)
assert OWN_FIELDS == (J.next_ms, J.spec)  # the order `call` writes them in
assert SHARED_FIELDS[:2] == (J.type, J.queue)  # what `call` reports group sizes by


class DedupArgs(NamedTuple):
    """A job's dedup window as a dedup call sends it: the window, and the id of the job its
    record named when the caller last called ('' for none: the first call)."""

    dedup: Dedup
    guess: str


def call(p: int, preps: list[Prepared], now: int, events_maxlen: int,
         dedups: Sequence[DedupArgs] | None = None
         ) -> tuple[Call, list[int] | None, list[tuple[Any, int]]]:
    """The script call for jobs of partition ``p``, the order it holds them in (indexes
    into ``preps``; None: as they are, one group): grouped by their SHARED_FIELDS values, each
    group's values sent once, and ((type, queue), size) of each group.  A call holds keyed or
    random ids only, so its first job tells which; and jobs with a dedup window (``dedups``,
    one per job of ``preps``) or none."""
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
                       len(SHARED_FIELDS), len(OWN_FIELDS), int(keyed), int(dedups is not None),
                       *SHARED_FIELDS, *OWN_FIELDS]
    # Dedup calls: each job's window, with the KEYS indexes of its record and its guess filled
    # in once the streams' indexes are known (their keys go after the streams).
    windows: list[list[Any]] = []
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
            if dedups is not None:
                args.append(_window(dedups[k], windows))
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
            if dedups is not None:
                args.append(_window(dedups[k], windows))
            if keyed:
                args.append(body_hash)
            args += (score, job.id, str(next_ms), blob)
        order += members
    ks += (keys.stream(p, queue) for queue in streams)
    if dedups is not None:
        _place_windows(p, args, ks, windows)
    sizes = [(shared[:2], len(members)) for shared, members in groups.items()]
    return ("schedule", ks, args), order if len(groups) > 1 else None, sizes


def _window(d: DedupArgs, windows: list[list[Any]]) -> list[Any]:
    """A placeholder for a job's window in the arguments, filled in by _place_windows."""
    w = [d.dedup.key, d.dedup.mode, d.dedup.ttl_ms, d.guess]
    windows.append(w)
    return w


def _place_windows(p: int, args: list[Any], ks: list[str], windows: list[list[Any]]) -> None:
    """The window placeholders in ``args`` written out as the header says (the record's KEYS
    index, mode, ttl_ms, the guess's KEYS index and id), each record and guessed job key added
    to ``ks`` once."""
    at: dict[str, int] = {}

    def index(key: str) -> int:
        if key not in at:
            ks.append(key)
            at[key] = len(ks)
        return at[key]

    flat: list[Any] = []
    for a in args:
        if type(a) is list:
            dedup_key, mode, ttl_ms, guess = a
            flat += (index(keys.dedup(p, dedup_key)), mode, ttl_ms,
                     index(keys.job(p, guess)) if guess else 0, guess)
        else:
            flat.append(a)
    args[:] = flat


class ScheduleReply(NamedTuple):
    """schedule.lua's reply: whether a job created is now the partition's earliest due one
    (wake a dispatcher), the time the script stamped on keyed jobs it created (their
    created_ms), a ScheduleCode value per job in the call's order, and the id of the job each
    DEDUPLICATED or HELD_ELSEWHERE code is about, in order."""

    wake: bool
    now_ms: int
    codes: list[int]
    about: list[str]

    @classmethod
    def of(cls, reply: Any, n: int) -> ScheduleReply:
        """The reply of a call of ``n`` jobs."""
        return cls(reply[0] == 1, int(reply[1]), reply[2:2 + n],
                   [x.decode() if isinstance(x, bytes) else x for x in reply[2 + n:]])


__all__ = ["DedupArgs", "ScheduleReply", "call"]
