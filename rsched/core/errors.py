"""Errors that name the offending field, so every face (Python, CLI, HTTP) can say what to fix."""

from __future__ import annotations


class RschedError(Exception):
    """Base class for every error rsched raises on purpose."""


class ValidationError(RschedError, ValueError):
    """Bad input: `field` names the input field (camelCase, as the HTTP API spells it)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class ScheduleError(ValidationError):
    """An invalid cron expression, time zone or run time."""


class NotFound(RschedError, LookupError):
    """No job, run or dead letter with that id."""

    def __init__(self, what: str, ident: str) -> None:
        super().__init__(f"{what} {ident!r} not found")
        self.what = what
        self.ident = ident


class RunFailed(RschedError):
    """A run waited for ended without succeeding (dead-lettered, cancelled, skipped, ...)."""

    def __init__(self, run_id: str, status: str, error: str | None) -> None:
        super().__init__(f"run {run_id} ended {status}" + (f": {error}" if error else ""))
        self.run_id = run_id
        self.status = status
        self.error = error


class Conflict(RschedError):
    """The request contradicts the stored state (idempotency key reuse, cancelled job, ...)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class PayloadTooLarge(ValidationError):
    """The msgpack-encoded payload exceeds the configured limit."""


class UnsafeRedis(RschedError):
    """Redis is configured so that it could lose jobs (eviction policy, wrong partition count)."""


class ClusterNodeUrl(UnsafeRedis):
    """A plain redis:// URL reaches a Redis Cluster node (seen at start, or as a MOVED or ASK
    reply): rsched would use only that node's slots."""

    def __init__(self) -> None:
        super().__init__("this Redis is a Redis Cluster node: use a redis+cluster://host:port"
                         "[,host:port...] URL so every master is used")


class NotReplicated(RschedError):
    """A write was applied on the primary, but fewer replicas than required confirmed it within
    the timeout (WAIT): it stands unless a failover now rolls it back.  Not an outage to retry
    blindly: a schedule retried without the same idempotency key makes a second job.
    ``job_id``: the job a schedule wrote (None: another write)."""

    def __init__(self, wanted: int, got: int, timeout_ms: int,
                 job_id: str | None = None) -> None:
        what = "write" if job_id is None else f"job {job_id}"
        unconfirmed = (f"{what} applied, but not confirmed by {wanted} replica(s) within "
                       f"{timeout_ms} ms ({got} confirmed): a failover now could undo it; ")
        super().__init__(unconfirmed + (
            "a retry is safe only with the same idempotency key (without one it schedules a "
            "second job)" if job_id is not None else
            "a retry applies it again (a schedule: safe only with the same idempotency key)"))
        self.wanted, self.got, self.timeout_ms, self.job_id = wanted, got, timeout_ms, job_id

    def of_job(self, job_id: str) -> NotReplicated:
        """The same shortfall, as the error of one scheduled job."""
        return NotReplicated(self.wanted, self.got, self.timeout_ms, job_id)


class VersionMismatch(Conflict):
    """The job's version is not the one the caller's If-Match names (HTTP 412)."""

    def __init__(self, expected: int, actual: str) -> None:
        super().__init__("If-Match", f"the job is at another version than {expected}"
                                     + (f" ({actual})" if actual else ""))
