"""The return codes of the Lua scripts, one IntEnum per script, mirroring each script's header
(tests/redis/test_scripts.py holds every enum against the header it mirrors)."""

from __future__ import annotations

from enum import IntEnum


class ScheduleCode(IntEnum):
    """schedule.lua, per job."""

    CREATED = 0
    SAME = 1  # already exists with the same body (an idempotent replay)
    CONFLICT = 2  # exists with another body
    DEDUPLICATED = 3  # answered by the job its dedup record names (its id follows the codes)
    HELD_ELSEWHERE = 4  # its dedup record names a job the call did not: call again with it


class ClaimCode(IntEnum):
    """claim.lua's first value when nothing was written."""

    STALE_LEASE = -1


class LeaseCode(IntEnum):
    """lease.lua."""

    HELD = 1  # the caller holds the lease
    OTHER = 0  # someone else holds it
    STALE = -1  # renew or release refused: the caller's fence is stale


class StartFence(IntEnum):
    """start.lua's per-run fence, when it is not a token (> 0)."""

    NOT_TO_RUN = 0  # finished, gone or cancelled: acknowledged
    FENCED = -1  # the entry is delivered to another consumer now


class ParkCode(IntEnum):
    """park.lua, per entry: a run of a job type the worker has no handler for."""

    PARKED = 1  # set aside for a worker that has its handler
    DEAD_LETTERED = 2  # no live worker served its type on its queue for the handler wait
    NOT_OURS = 0  # delivered to another consumer, or its run is finished or gone


class HeartbeatCode(IntEnum):
    """heartbeat.lua, per run."""

    OURS = 1
    STOP = 2  # ours, and asked to stop (overlap cancelPrevious): the worker cancels it
    GONE = 0  # finished or gone
    FENCED = -1  # live under another worker or fence, or delivered to another consumer


class CompleteCode(IntEnum):
    """complete.lua, per run."""

    SUCCEEDED = 1
    RETRY = 2
    DEAD = 3
    CANCELLED = 4  # recorded as cancelled (asked to stop by overlap cancelPrevious)
    DUPLICATE = 0  # a repeated report of an outcome already recorded
    FENCED = -1


class ControlCode(IntEnum):
    """pause, resume, cancel, trigger, replay and update: {code, status}."""

    DONE = 1
    ALREADY = 0  # already as requested
    NOT_FOUND = -1
    REFUSED = -2  # not allowed in the current status (the status says why)
    CHANGED = -3  # update.lua only: changed since it was read
    VERSION = -4  # pause, resume, cancel, update: the job's version is not the If-Match one
    OVERLAP = -5  # replay only: the job's overlap policy holds it (status: why)


class BackfillCode(IntEnum):
    """backfill.lua: the call's code."""

    DONE = 1  # each occurrence's BackfillRun follows
    NOT_FOUND = -1
    REFUSED = -2  # the job is cancelled
    OTHER_TAIL = -3  # bufferAll: the job's last bufferAll run is not the caller's (it is status)


class BackfillRun(IntEnum):
    """backfill.lua, per occurrence."""

    QUEUED = 1  # due now through the retry set
    EXISTS = 0  # a run of it exists: it ran (or is running, waiting, dead) already
    SKIPPED = 2  # recorded as a skipped run by the overlap policy
    BUFFERED = 3  # overlap bufferOne: starts when the job's active run ends


class DeleteDeadCode(IntEnum):
    """delete_dead.lua, per run."""

    DELETED = 1
    NOT_DEAD = 0  # not in the dead set (replayed or deleted meanwhile, or never dead)


class ExpireCode(IntEnum):
    """expire.lua: a run's first attempt and its start deadline (startDeadlineSeconds)."""

    DEAD_LETTERED = 1  # past the deadline: dead-lettered, not to be run
    RUN = 0  # in time (or not such a run): run it


class OperationStep(IntEnum):
    """operation_step.lua: a runner's hold on a background operation."""

    HELD = 1  # the caller holds the lease (progress recorded)
    OTHER = 0  # another runner holds an unexpired lease, or the caller's fence is stale
    ENDED = -1  # cancelled, succeeded or failed: nothing more to do
    GONE = -2  # no such operation (expired)


class OperationCancel(IntEnum):
    """operation_cancel.lua."""

    CANCELLED = 1
    ENDED = 0  # had ended already (its status is returned)
    GONE = -2  # no such operation
