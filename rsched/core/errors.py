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
    """A write reached the primary, but fewer replicas than required confirmed it within the
    timeout (WAIT): a failover now could roll it back.  Retrying is safe (with the same
    idempotency key for a schedule): every write is safe to apply twice."""

    retry_after_s = 1

    def __init__(self, wanted: int, got: int, timeout_ms: int) -> None:
        super().__init__(f"write not confirmed by {wanted} replica(s) within {timeout_ms} ms "
                         f"({got} confirmed); retry it")
        self.wanted, self.got, self.timeout_ms = wanted, got, timeout_ms


class VersionMismatch(Conflict):
    """The job's version is not the one the caller's If-Match names (HTTP 412)."""

    def __init__(self, expected: int, actual: str) -> None:
        super().__init__("If-Match", f"the job is at another version than {expected}"
                                     + (f" ({actual})" if actual else ""))
