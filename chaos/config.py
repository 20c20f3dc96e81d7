"""The timings and sizes of one checker run, in one place (units in the names)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rsched.core import defaults

# Every cron job fires every 2 or 3 seconds (6 fields, seconds first), in zones with whole-hour,
# half-hour and 45-minute offsets, and with and without DST.
CRON_ZONES = (
    "UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Adelaide",
    "Asia/Kathmandu", "America/Sao_Paulo", "Pacific/Auckland", "Africa/Cairo", "Asia/Tokyo",
)  # fmt: skip
CRON_EXPRS = ("*/2 * * * * *", "*/3 * * * * *")
# (catch-up window, misfire), taken in turn: the default (every occurrence a fault delays must
# still run), and a window shorter than a dispatcher outage with misfire skip (an occurrence older
# than it is skipped, and only such a one).
CRON_WINDOWS = ((60_000, "run_once"), (1_000, "skip"))
REDIS_KINDS = ("single", "cluster", "sentinel")


@dataclass(frozen=True, slots=True)
class RunConfig:
    seed: int = 1
    duration_s: float = 45.0  # load and faults; draining and analysis come after
    rate_per_s: int = 150  # one-off jobs the load generator schedules per second
    cron_jobs: int = 20
    dispatchers: int = 2
    workers: int = 3
    partitions: int = 16
    # The defaults of rsched: a dead worker's runs are taken over by its missed process
    # heartbeats (dead_after_ms), a dead dispatcher's partitions when its lease runs out.
    lease_ms: int = defaults.LEASE_MS
    visibility_ms: int = defaults.VISIBILITY_MS
    heartbeat_ms: int = defaults.HEARTBEAT_MS
    dead_after_ms: int = defaults.DEAD_AFTER_MS
    concurrency: int = 64
    slow_s: tuple[float, float] = (3.5, 4.5)  # longer than dead-after: only beats keep them
    max_attempts: int = 10  # flaky jobs fail up to 2 attempts; faults cost attempts too
    drain_s: float = 45.0  # after the faults: how long everything acknowledged may take (past
    # the visibility timeout, the backstop after a Redis data loss)
    fault_gap_s: tuple[float, float] = (0.5, 2.0)  # quiet time between two faults
    redis_fault_every_s: float = 12.0  # at least this long between two Redis faults
    aof_window_s: float = 1.0  # appendfsync everysec: the unsynced tail a machine loss drops
    faults: bool = True
    # "single": one AOF redis-server behind per-process proxies; "cluster": 3 masters + 3
    # replicas (redis+cluster:// URL, each process through a proxy per node), masters killed
    # with -9; "sentinel": a primary, its replica and 3 Sentinels (redis+sentinel:// URL,
    # processes connect directly), the primary killed with -9.
    redis: str = "single"
    node_timeout_ms: int = 2000  # cluster-node-timeout: failure detection before an election
    lag_s: tuple[float, float] = (1.0, 2.0)  # a master's replica paused this long before its kill
    wait_timeout_ms: int = 300  # RSCHED_WAIT_TIMEOUT_MS of the cluster and Sentinel runs' processes
    # Limits (docs/limits.md): with limit_keys > 0, one in five one-off jobs names one of that
    # many keys of the family chaos-*, which allows limit_concurrency runs of each at once.
    limit_keys: int = 0
    limit_concurrency: int = 2

    def __post_init__(self) -> None:
        if self.redis not in REDIS_KINDS:
            raise ValueError(f"--redis: {self.redis!r} is not one of {', '.join(REDIS_KINDS)}")

    @property
    def takeover_ms(self) -> int:
        """How long a worker's silence lasts at most before its runs are taken over."""
        return min(self.visibility_ms, self.dead_after_ms)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
