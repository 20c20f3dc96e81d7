"""Which logged fault explains an observation: the windows in which a fault disturbed a process.

A fault disturbs its process over a window of wall-clock ms: kill -9 from the kill on (that
incarnation never comes back), SIGSTOP and proxy freeze while they last, a dropped connection
for 2 s after (reconnect and the retried call), and a Redis fault disturbs every process from
the crash (for a machine loss: from the simulated last fsync, whose later writes are undone)
until 2 s after Redis answers again.  A cluster master's kill (`redis_master_kill`) disturbs
every process from the moment its replica was paused (what the master took since then is rolled
back by the failover) until 2 s after the replica was promoted; like a machine loss it undoes
writes, though never an acknowledged client write (those waited for the replica); so does a
Sentinel primary's kill (`redis_primary_kill`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INF = float("inf")
AFTER_DROP_MS = 2000
AFTER_REDIS_MS = 2000
FAILOVER_OPS = ("redis_master_kill", "redis_primary_kill")  # a lagging replica promoted
ROLLBACK_OPS = ("redis_lose", *FAILOVER_OPS)  # faults that undo writes Redis had taken
PROCESS_OPS = {
    "kill_worker": "kill", "kill_dispatcher": "kill", "stop_worker": "stop",
    "stop_dispatcher": "stop", "freeze_worker": "freeze", "freeze_dispatcher": "freeze",
    "drop": "drop",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Fault:
    op: str
    process: str | None  # None: Redis, which every process depends on
    lo_ms: float
    hi_ms: float

    def label(self) -> str:
        return f"{self.op} {self.process or 'redis'} @{int(self.lo_ms)}"


def windows(log: list[dict[str, Any]]) -> list[Fault]:
    out = []
    for e in log:
        op, t0, t1 = e["op"], e["t0"], e.get("t1", e["t0"])
        if op.startswith("kill_"):
            out.append(Fault(op, e["process"], t0, INF))
        elif op == "drop":
            out.append(Fault(op, e["process"], t0, t0 + AFTER_DROP_MS))
        elif op in PROCESS_OPS:
            out.append(Fault(op, e["process"], t0, t1))
        elif op == "redis_lose":
            out.append(Fault(op, None, e.get("fsynced_ms", t0), t1 + AFTER_REDIS_MS))
        elif op in FAILOVER_OPS:
            # A Sentinel fail-back to the restarted old primary rolls back the promoted node's
            # writes since its promotion: the window lasts until the group is healthy again.
            end = e.get("healthy_ms", t1) if e.get("failed_back") else t1
            out.append(Fault(op, None, e.get("lagged_ms", t0), end + AFTER_REDIS_MS))
        else:
            out.append(Fault(op, None, t0, t1 + AFTER_REDIS_MS))
    return out


class Faults:
    def __init__(self, log: list[dict[str, Any]]) -> None:
        self.log = log
        self.all = windows(log)
        self.redis_losses = [f for f in self.all if f.op in ROLLBACK_OPS]

    def hit(self, process: str, lo_ms: float, hi_ms: float,
            started_by_ms: float = INF) -> Fault | None:
        """A fault that disturbed `process` (or Redis) within [lo, hi] and began by
        `started_by_ms`."""
        for f in self.all:
            if f.process in (None, process) and f.lo_ms <= hi_ms and f.hi_ms >= lo_ms \
                    and f.lo_ms <= started_by_ms:
                return f
        return None

    def rolled_back(self, lo_ms: float, hi_ms: float) -> Fault | None:
        """A machine loss or failover whose undone writes may include something done within
        [lo, hi]."""
        for f in self.redis_losses:
            if f.lo_ms <= hi_ms and f.hi_ms >= lo_ms:
                return f
        return None
