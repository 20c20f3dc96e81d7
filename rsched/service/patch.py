"""What an update may change: a job's spec with some fields replaced, validated like a new one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsched.core.errors import ValidationError
from rsched.core.models import Job, JobStatus
from rsched.core.spec import JobSpec
from rsched.core.values import Unreadable


@dataclass(frozen=True, slots=True)
class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""A patch field left out, told apart from None (which clears ``cron`` or ``payload``)."""


@dataclass(frozen=True, slots=True)
class JobPatch:
    """What PATCH /jobs/{id} may change; fields left UNSET keep their stored value.

    Giving ``run_at``, ``cron`` or ``tz`` reschedules: a cron job's next run is computed from now.
    """

    run_at: Any = UNSET
    cron: Any = UNSET
    tz: Any = UNSET
    payload: Any = UNSET
    max_attempts: Any = UNSET
    priority: Any = UNSET
    misfire: Any = UNSET
    catch_up_window_ms: Any = UNSET
    overlap: Any = UNSET
    # Lifecycle limits (core.lifecycle); None removes one.
    start_at: Any = UNSET
    end_at: Any = UNSET
    max_runs: Any = UNSET
    pause_after_failures: Any = UNSET
    start_deadline_ms: Any = UNSET

    @property
    def reschedules(self) -> bool:
        return any(v is not UNSET for v in (self.run_at, self.cron, self.tz, self.start_at,
                                            self.end_at))

    def apply(self, job: Job) -> JobSpec:
        """The job's spec with this patch applied, to validate and prepare like a new one."""
        if self.run_at is not UNSET and self.cron is not UNSET and self.cron is not None:
            raise ValidationError("runAt", "give either runAt or cron, not both")
        run_at: Any = job.run_at_ms
        cron = job.cron
        if self.cron is not UNSET:
            cron, run_at = self.cron, None
        if self.run_at is not UNSET:
            cron, run_at = None, self.run_at
        life = job.life
        max_runs = (life.max_runs or None) if self.max_runs is UNSET else self.max_runs
        if isinstance(max_runs, int) and self.max_runs is not UNSET and 0 < max_runs <= job.runs:
            raise ValidationError("maxRuns", f"the job has started {job.runs} runs already; "
                                             "give more, or cancel it")
        if self.payload is UNSET and isinstance(job.payload, Unreadable):
            raise ValidationError("payload", "the stored payload cannot be read ("
                                  f"{job.payload['$unreadable']}); give a new payload")
        return JobSpec(
            type=job.type, payload=job.payload if self.payload is UNSET else self.payload,
            run_at=run_at, cron=cron, tz=job.tz if self.tz is UNSET else self.tz,
            queue=job.queue, backoff_base_ms=job.backoff_base_ms,
            backoff_cap_ms=job.backoff_cap_ms, timeout_ms=job.timeout_ms,
            max_attempts=job.max_attempts if self.max_attempts is UNSET else self.max_attempts,
            priority=job.priority if self.priority is UNSET else self.priority,
            idempotency_key=job.idempotency_key,
            misfire=job.misfire.value if self.misfire is UNSET else self.misfire,
            jitter_ms=job.jitter_ms, paused=job.status is JobStatus.PAUSED,
            catch_up_window_ms=(job.catch_up_window_ms if self.catch_up_window_ms is UNSET
                                else self.catch_up_window_ms),
            # a one-off job has no overlap: a stored one falls back to allow, a given one is
            # refused by validation
            overlap=(self.overlap if self.overlap is not UNSET
                     else job.overlap.value if cron else "allow"),
            start_at=_kept(self.start_at, life.start_at_ms),
            end_at=_kept(self.end_at, life.end_at_ms), max_runs=max_runs,
            pause_after_failures=_kept(self.pause_after_failures, life.pause_after),
            start_deadline_ms=_kept(self.start_deadline_ms, life.start_deadline_ms),
            target=job.target,  # an http job keeps its target (prepare checks it again)
        )


def _kept(given: Any, stored: int) -> Any:
    """A limit as patched: the stored one (0: none) unless given (None removes it)."""
    return (stored or None) if given is UNSET else given
