"""What an update may change: a job's spec with some fields replaced, validated like a new one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsched.core.errors import ValidationError
from rsched.core.models import Job, JobStatus
from rsched.core.spec import JobSpec


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

    @property
    def reschedules(self) -> bool:
        return any(v is not UNSET for v in (self.run_at, self.cron, self.tz))

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
        )
