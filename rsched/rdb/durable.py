"""Writes acknowledged only once replicas have them: WAIT after a client-facing write.

Redis replicates asynchronously, so a write acknowledged by a primary that dies before its
replica received it is gone after the failover.  WAIT <replicas> <timeout> on the connection
that wrote blocks until that many replicas have everything the connection wrote; it goes in the
same pipeline as the writes (on a cluster, in each master's pipeline).  When fewer replicas
confirm in time, each write of that pipeline is answered with NotReplicated (retryable: the
write may or may not survive a failover, and every rsched write is safe to apply twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsched.core.errors import NotReplicated

ATTR = "rsched_wait"  # the client attribute that holds its Wait (set by rdb.connect)


@dataclass(frozen=True, slots=True)
class Wait:
    replicas: int
    timeout_ms: int

    def command(self) -> tuple[Any, ...]:
        return ("WAIT", self.replicas, self.timeout_ms)

    def confirm(self, replies: list[Any]) -> list[Any]:
        """The writes' replies (the last reply is WAIT's); each becomes NotReplicated when
        WAIT fell short."""
        last, replies = replies[-1], replies[:-1]
        got = last if isinstance(last, int) else 0
        if got >= self.replicas:
            return replies
        short = NotReplicated(self.replicas, got, self.timeout_ms)
        return [r if isinstance(r, Exception) else short for r in replies]


def wait_of(r: Any) -> Wait | None:
    """The client's durability setting (None: acknowledge on the primary's word)."""
    return getattr(r, ATTR, None)


def set_wait(r: Any, replicas: int, timeout_ms: int) -> Any:
    if replicas > 0:
        setattr(r, ATTR, Wait(replicas, timeout_ms))
    return r
