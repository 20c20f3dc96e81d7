"""Wire layouts named once: the fields the Lua scripts write to streams, as Python reads them
(bytes, as Redis returns them), and the claim script's per-item arguments.

Queue stream entries are written by lua/claim.lua (its header lists them); events-stream entries
by every script through ``emit`` and ``batch_flush`` in lua/include/util.lua.
tests/unit/test_wire.py holds these names against the scripts.
"""

from __future__ import annotations

from typing import Any, NamedTuple


def as_text(v: Any) -> str:
    """A reply value as text: bytes unless the client decodes responses."""
    return v.decode() if isinstance(v, bytes) else str(v)


def parse_sid(sid: bytes | str) -> tuple[int, int]:
    """A stream entry id: ``b"1700000000000-3"`` -> (1700000000000, 3)."""
    s = sid.decode() if isinstance(sid, bytes) else sid
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


# Queue stream entry (rsched:{pN}:q:<queue>), see lua/claim.lua's header.  The job id and the
# scheduled time are in the run id.
ENTRY_RUN = b"r"  # run id, <job id>@<scheduled ms>
ENTRY_TYPE = b"t"  # job type
ENTRY_ATTEMPT = b"a"  # attempt number; left out for a first attempt (one field fewer to read)
ENTRY_SPEC = b"x"  # the job's packed spec (models.SPEC_ORDER)
ENTRY_OWN = b"o"  # present ('1') for a one-off job's own run: its run key is the job key
# When the run was meant to start (ms), present where that is not its scheduled time: a run let
# go from the retry set (backfill, trigger, bufferOne, replay, retry) or a one-off job created
# with a time already past.  Start lag counts from it.
ENTRY_DUE = b"d"
ENTRY_FIELDS = (ENTRY_RUN, ENTRY_TYPE, ENTRY_ATTEMPT, ENTRY_SPEC, ENTRY_OWN, ENTRY_DUE)

# Events stream entry (rsched:{pN}:events).
EV_EVENT = b"e"  # event name: scheduled, dispatched, started, succeeded, ...
EV_JOB = b"j"  # job id
EV_RUN = b"r"  # run id
EV_ATTEMPT = b"a"  # attempt number
EV_TIME = b"t"  # when, ms (note: 't' is the job type in a queue entry)
EV_WORKER = b"w"  # worker id
EV_DURATION = b"d"  # duration_ms of a finished attempt
EV_TYPE = b"ty"  # job type
EV_QUEUE = b"q"  # queue
EV_SCHED = b"s"  # scheduled ms (derived from the run id when there is one)
EV_ERROR = b"err"  # error text of a failed attempt
EV_RESULT = b"res"  # JSON result of a succeeded attempt
EV_FENCE = b"f"  # the fence of a fenced report
EV_RETRY_AT = b"at"  # retry_scheduled: when the retry is due, ms
EV_STARTED = b"st"  # an outcome that also records its run's start: the start ms
EV_COUNT = b"n"  # a batched entry (batch_flush): how many events it holds
EV_BY = b"by"  # dead_deleted: who deleted the dead letter (no column: kept in the extra JSON)
EV_PROGRESS = b"pg"  # progress: the handler's report, JSON (no column: kept in the extra JSON)
EV_FIELDS = (EV_EVENT, EV_JOB, EV_RUN, EV_ATTEMPT, EV_TIME, EV_WORKER, EV_DURATION, EV_TYPE,
             EV_QUEUE, EV_SCHED, EV_ERROR, EV_RESULT, EV_FENCE, EV_RETRY_AT, EV_STARTED)
"""Event fields with an archive column (EV_COUNT is the batch's, not an event's)."""



class ClaimItem(NamedTuple):
    """One per-item argument group of lua/claim.lua (its header: "then per item 8 values")."""

    kind: str  # CLAIM_JOB or CLAIM_RETRY
    job_id: str
    run_id: str
    score: float | int  # due score as read (a retry: its due ms in the retry set)
    expected: int | str  # a job's next_ms, the compare-and-set ('0' / 0 for a retry)
    next_ms: int  # the following occurrence ('0' / 0 = none)
    next_score: float | int  # its due score
    fire: int | str  # 1 = run, 0 = run nothing, s / b / c = run under overlap skip / bufferOne /
    # cancelPrevious; then optionally ' <gap>' (models.gap_text): record it


CLAIM_JOB = "j"  # an occurrence the dispatcher read, with its next time computed
CLAIM_RETRY = "r"  # a retry, replay or trigger of a run
