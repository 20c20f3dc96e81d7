"""The scripts the service runs on one job, run or dead letter: one function per script builds
its call (KEYS and ARGV in the order of the script's header, from domain values) and a small
parser turns its reply into a core.codes value.  A change to a script's arguments touches the
.lua file and the function here, nothing in the service.

Every call passes now_ms 0: the script stamps Redis's clock (its header's ARGV now_ms).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rsched.core.codes import BackfillCode, BackfillRun, ControlCode, DeleteDeadCode
from rsched.core.ids import run_id as make_run_id
from rsched.core.models import BackfillOverlap, Overlap, job_of_run, partition_of
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.scripts import Call

_NOW = 0  # now_ms: Redis TIME


def _expected(if_match: int | None) -> int | str:
    """An ``expected version`` argument: '' matches any version."""
    return "" if if_match is None else if_match


def _control_keys(job_id: str) -> list[str]:
    """KEYS of pause, resume, cancel and update: the job hash, due set, events stream."""
    p = partition_of(job_id)
    return [keys.job(p, job_id), keys.due(p), keys.events(p)]


def pause(job_id: str, events_maxlen: int, if_match: int | None, by: str, note: str) -> Call:
    """lua/pause.lua: ``by`` and ``note`` ('' for none) are kept with the time."""
    return ("pause", _control_keys(job_id),
            [job_id, _NOW, events_maxlen, _expected(if_match), by, note])


def cancel(job_id: str, events_maxlen: int, if_match: int | None, finished_ttl_ms: int) -> Call:
    """lua/cancel.lua: a cancelled one-off job is kept ``finished_ttl_ms`` (0 = forever)."""
    return ("cancel", _control_keys(job_id),
            [job_id, _NOW, events_maxlen, _expected(if_match), finished_ttl_ms])


def resume(job_id: str, events_maxlen: int, next_ms: int, score: float, if_match: int | None,
           by: str, note: str) -> Call:
    """lua/resume.lua: ``next_ms`` the nominal next occurrence (0: none left), ``score`` its
    due score."""
    return ("resume", _control_keys(job_id),
            [job_id, _NOW, events_maxlen, next_ms, score, _expected(if_match), by, note])


def update(job_id: str, events_maxlen: int, status: str, next_ms: int, new_next_ms: int | str,
           score: float | str, if_match: int | None, pairs: Sequence[Any]) -> Call:
    """lua/update.lua, compare-and-set on ``status`` and ``next_ms`` as read (0: none);
    ``new_next_ms`` '' leaves the schedule alone; ``pairs``: field, value, ... to set."""
    return ("update", _control_keys(job_id),
            [job_id, _NOW, events_maxlen, status, next_ms, new_next_ms, score,
             _expected(if_match), len(pairs) // 2, *pairs])


def trigger(job_id: str, run_id: str, sched_ms: int, events_maxlen: int) -> Call:
    """lua/trigger.lua: one run ``run_id`` of the job, nominally at ``sched_ms``."""
    p = partition_of(job_id)
    return ("trigger", [keys.job(p, job_id), keys.run(p, run_id), keys.retry(p), keys.events(p)],
            [job_id, run_id, sched_ms, _NOW, events_maxlen])


# The overlap policy as backfill.lua and replay.lua take it.
_POLICY = {Overlap.ALLOW: "", Overlap.SKIP: "s", Overlap.BUFFER_ONE: "b",
           Overlap.CANCEL_PREVIOUS: "c"}


def replay(run_id: str, events_maxlen: int, overlap: Overlap) -> Call:
    """lua/replay.lua: the dead letter ``run_id`` back to the retry set, under its job's
    ``overlap`` policy."""
    job_id = job_of_run(run_id)
    p = partition_of(job_id)
    return ("replay", [keys.run(p, run_id), keys.job(p, job_id), keys.dead(p), keys.retry(p),
                       keys.events(p)],
            [run_id, _NOW, events_maxlen, _POLICY[overlap]])


class ControlReply(NamedTuple):
    """{code, status} of pause, resume, cancel, trigger, replay and update (replay: the run's
    state)."""

    code: ControlCode
    status: str

    @classmethod
    def of(cls, reply: Any) -> ControlReply:
        code, status = reply
        return cls(ControlCode(int(code)), as_text(status))


# A backfill's overlap policy as backfill.lua takes it: the job's letters, and bufferAll.
_BACKFILL_POLICY = {BackfillOverlap(o.value): c for o, c in _POLICY.items()} | {
    BackfillOverlap.BUFFER_ALL: "a"}


def backfill(job_id: str, events_maxlen: int, run_ttl_ms: int, history_len: int,
             overlap: BackfillOverlap, sched_ms: Sequence[int], dry: str, tail: str = "") -> Call:
    """lua/backfill.lua over the occurrences ``sched_ms`` (one chunk); ``dry`` '' for a backfill,
    '=' or '<active>|<buffered>' for a dry run; ``tail`` (bufferAll) the job's last bufferAll
    run as read, '' for none (see its header)."""
    p = partition_of(job_id)
    tail_key = keys.run(p, tail or make_run_id(job_id, 0))  # unused without a tail
    ks = [keys.job(p, job_id), keys.retry(p), keys.events(p), keys.history(p, job_id), tail_key,
          *(keys.run(p, make_run_id(job_id, t)) for t in sched_ms)]
    return ("backfill", ks, [job_id, _NOW, events_maxlen, run_ttl_ms,
                             _BACKFILL_POLICY[overlap], dry, history_len, tail, len(sched_ms),
                             *sched_ms])


class BackfillReply(NamedTuple):
    """backfill.lua's reply: the call's code, the job's status (when refused), each
    occurrence's BackfillRun, and a dry run's active and buffered run ids ('' for none)."""

    code: BackfillCode
    status: str
    runs: list[BackfillRun]
    active: str = ""
    buffered: str = ""

    @classmethod
    def of(cls, reply: Any, n: int) -> BackfillReply:
        """The reply of a call over ``n`` occurrences."""
        code = BackfillCode(int(reply[0]))
        runs = [BackfillRun(int(c)) for c in reply[2 : 2 + n]]
        rest = [as_text(v) for v in reply[2 + n : 4 + n]]
        return cls(code, as_text(reply[1]), runs, *rest)


def delete_dead(p: int, run_ids: Sequence[str], events_maxlen: int, who: str,
                history_len: int, op_id: str = "", keep_ms: int = 0) -> Call:
    """lua/delete_dead.lua on dead letters of partition ``p``; ``who`` is recorded with each
    deletion; a purge passes its operation ``op_id``, under which the deletions are counted
    (the count kept ``keep_ms``)."""
    ks = [keys.dead(p), keys.events(p), keys.op_counts(p)]
    for rid in run_ids:
        job_id = job_of_run(rid)
        ks += [keys.run(p, rid), keys.job(p, job_id), keys.history(p, job_id)]
    return ("delete_dead", ks, [_NOW, events_maxlen, who, history_len, op_id, keep_ms,
                                len(run_ids), *run_ids])


def deleted(reply: Any) -> list[DeleteDeadCode]:
    """delete_dead.lua's reply: a code per run id."""
    return [DeleteDeadCode(int(c)) for c in reply]


def dead_page(p: int, after: tuple[float, str] | None, top: int | str | None, count: int,
              newest_first: bool = True) -> Call:
    """lua/dead_page.lua: partition ``p``'s next ``count`` dead letters after the letter
    ``after`` (dead ms, run id; None: from the first of the order), only those dead by ``top``
    ms when given."""
    score, rid = ("", "") if after is None else (repr(after[0]), after[1])
    return ("dead_page", [keys.dead(p)], [score, rid, "" if top is None else top, count,
                                          "desc" if newest_first else "asc"])


def dead_letters(reply: Any) -> list[tuple[str, float]]:
    """dead_page.lua's reply: (run id, dead ms) of each letter, newest first."""
    return [(as_text(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


__all__ = ["BackfillReply", "ControlReply", "backfill", "cancel", "dead_letters", "dead_page",
           "delete_dead", "deleted", "pause", "replay", "resume", "trigger", "update"]
