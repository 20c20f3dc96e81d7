"""The state of the runs a worker has in flight: each run's phase and fencing token, its outcome
once its handler returns, and the table of them all that decides how many new runs fit."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rsched.core.handlers import AttemptFailed, JobContext
from rsched.core.wire import ENTRY_OWN, ENTRY_TYPE
from rsched.rdb import keys


class Phase(Enum):
    """Where a run's start stands.  A run is taken before its start is recorded (see the
    reporter): its report then records the start, unless a start script got there first."""

    NOT_STARTED = "not started"  # no start recorded: fence 0, a report starts and ends it
    STARTING = "starting"  # a start script for it is under way: its outcome waits
    STARTED = "started"  # start recorded: fence holds its token (heartbeated, reported with it)
    NOT_OURS = "not ours"  # Redis refused it to us: never started, heartbeated or reported


# Module-level names: the phase tests run per job on the report path (a global, not an
# attribute lookup on the enum class).
NOT_STARTED, STARTING, STARTED, NOT_OURS = (Phase.NOT_STARTED, Phase.STARTING, Phase.STARTED,
                                            Phase.NOT_OURS)


@dataclass(slots=True)
class Inflight:
    """One run taken from a stream, from its read until its report: what every part of the
    worker needs about it, kept in one slotted object (one allocation per run)."""

    partition: int
    stream: str
    entry_id: str
    run_id: str
    job_id: str
    attempt: int
    t0: float = 0.0  # perf_counter when the run was taken
    # Before the fields that hold their defaults at first: inflight() passes these by position.
    run_key: str = ""  # where the run's fields live (the job hash for a one-off job's own run)
    job_key: str = ""
    sched_ms: int = 0
    type: str = ""
    queue: str = ""
    phase: Phase = NOT_STARTED
    fence: int = 0  # the run's token once STARTED; 0 before (what complete.lua gets then)
    deadline: float = float("inf")  # loop time its handler times out
    task: asyncio.Task[Any] | None = None  # the handler's task, cancelled on timeout
    timed_out: bool = False
    stop: bool = False  # asked to stop (overlap cancelPrevious): its outcome is 'cancelled'
    ctx: JobContext | None = None  # the handler's context, once its handler runs
    finished: bool = False  # its handler returned; the report records the start if need be
    defer_ms: int = 0  # the handler raised RateLimited: how long the run waits (no attempt)
    failed: AttemptFailed | None = None  # the handler raised it: final, or its retry_after
    progress: str = ""  # the handler's latest progress (JSON), sent with the next heartbeat
    progress_new: bool = False  # not sent yet


def inflight(p: int, stream: str, queue: str, eid: str, rid: str, f: dict[bytes, bytes],
             attempt: int, t0: float) -> Inflight:
    """A run from its stream entry and its run id (decoded by the caller, which checks it
    first): the run id holds the job id and the scheduled time; 'o' marks a one-off job's own
    run, whose fields live in the job hash (lua/include/util.lua)."""
    job_id, _, sched = rid.rpartition("@")
    job_key = (_JOB_PREFIX.get(p) or job_prefix(p)) + job_id  # keys.job(p, job_id)
    run_key = job_key if ENTRY_OWN in f else keys.run(p, rid)
    return Inflight(p, stream, eid, rid, job_id, attempt, t0, run_key, job_key, int(sched),
                    f[ENTRY_TYPE].decode(), queue)


_JOB_PREFIX: dict[int, str] = {}


def job_prefix(p: int) -> str:
    """keys.job(p, "") once per partition: a job key is that prefix and the job id (a test holds
    the two together), which saves inflight() three calls into rsched.rdb.keys per run."""
    pre = _JOB_PREFIX[p] = keys.job(p, "")
    return pre


def request_stop(fl: Inflight) -> bool:
    """Ask a run to stop (overlap cancelPrevious, told by its heartbeat): a sync handler sees
    ``ctx.cancelled``, an async one is cancelled; one not started yet never starts.  False when
    it was asked already or has finished."""
    if fl.stop or fl.finished:
        return False
    fl.stop = True
    if fl.ctx is not None:
        fl.ctx.cancelled = True
        if fl.task is not None and not fl.task.done():
            fl.task.cancel()
    return True


@dataclass(slots=True)
class Outcome:
    """A finished attempt waiting for its report."""

    fl: Inflight
    status: str  # succeeded | failed | timed_out | cancelled | deferred (RateLimited)
    duration_ms: int
    text: str
    delay_ms: int
    type: str = ""
    queue: str = ""


class Runs:
    """The runs in flight by run id, and how many of them only wait for their report: the two
    numbers the free-slot rule needs.  The parts that add and drop runs touch ``by_id`` and
    ``finished`` directly (per job, no method call)."""

    __slots__ = ("by_id", "concurrency", "finished")

    def __init__(self, concurrency: int) -> None:
        self.by_id: dict[str, Inflight] = {}
        self.concurrency = concurrency
        self.finished = 0  # runs whose handler has returned (report pending)

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self.by_id

    def free(self, freed: int = 0) -> int:
        """Slots for new runs.  A finished run waiting for its report holds no slot (up to
        ``concurrency`` of them), so the report's round trip never idles the handlers.
        ``freed``: as if a report took that many finished runs off first."""
        running = len(self.by_id) - self.finished
        return min(self.concurrency - running, 2 * self.concurrency - len(self.by_id) + freed)

    def forget_finished(self, fl: Inflight) -> None:
        """Drop a finished run whose outcome will not be reported (off the per-job path)."""
        if self.by_id.pop(fl.run_id, None) is not None:
            self.finished -= 1
