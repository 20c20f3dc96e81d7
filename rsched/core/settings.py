"""Settings shared by every rsched process, read from the environment once."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from rsched.core import defaults
from rsched.core.errors import ValidationError


def _retention_env(name: str) -> tuple[tuple[str, int], ...]:
    """``queue=ms,queue=ms``: a retention per queue (see Settings.queue_retention_ms)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ()
    out: dict[str, int] = {}
    for item in raw.split(","):
        queue, sep, ms = item.strip().partition("=")
        if not sep or not queue.strip() or not ms.strip().isdigit():
            raise ValidationError(name, f"expected queue=ms[,queue=ms...], got {item!r}")
        out[queue.strip()] = int(ms)
    return tuple(out.items())


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValidationError(name, f"expected an integer, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Number of partitions; fixed at first start and stored in Redis, since a job's partition is
    # derived from its id.  0 = use the stored count (defaults.PARTITIONS at first start): only
    # a process given an explicit count refuses to run when it differs from the stored one.
    partitions: int = 0
    # Upper bound on a msgpack payload; big payloads belong in object storage, not in Redis.
    max_payload_bytes: int = 64 * 1024
    # Finished attempts kept per job in Redis (the archive keeps everything).
    history_len: int = 50
    # How long a finished run's hash stays in Redis; the job's history list and the archive keep
    # the record after that.  Dead letters never expire.
    run_ttl_ms: int = 86_400_000
    # How long a completed or cancelled one-off job (its hash, own run and attempts) stays in
    # Redis, so millions of one-off jobs do not fill it; 0 = forever.  The archive keeps the
    # history, and the job's idempotency key is remembered as long as the job.  Dead jobs never
    # expire.
    finished_ttl_ms: int = 7 * 86_400_000
    # Per queue, how long its finished runs and completed one-off jobs stay instead of run_ttl_ms
    # and finished_ttl_ms ((queue, ms) pairs; 0 = forever); applied by the workers that end them.
    queue_retention_ms: tuple[tuple[str, int], ...] = ()
    # Approximate cap on each partition's events stream; 0 keeps every event until the archiver
    # trims it, which is what "nothing lost" needs when Postgres is down.
    events_maxlen: int = 0
    # While no consumer group (archiver) reads a partition's events stream, the dispatcher
    # trims it to this many entries and to entries younger than events_keep_ms (0 = no such
    # bound); a stream an archiver reads is trimmed to what it has read (lua/trim_streams.lua).
    events_keep: int = defaults.EVENTS_KEEP
    events_keep_ms: int = defaults.EVENTS_KEEP_MS
    # Allow a Redis that may evict keys or has AOF off: tests and throwaway setups only.
    allow_unsafe_redis: bool = False
    # Replicas that must confirm each client-facing write (see rdb.durable); -1: by URL.
    wait_replicas: int = defaults.WAIT_REPLICAS_BY_URL
    wait_timeout_ms: int = defaults.WAIT_TIMEOUT_MS
    # How often (ms) an API process samples the cluster's counters for the overview's history
    # charts; a minute suits the last hour they show (tests sample faster).
    stats_sample_ms: int = defaults.STATS_SAMPLE_MS

    def retention_of(self, queue: str) -> tuple[int, int]:
        """(run_ttl_ms, finished_ttl_ms) for the runs of ``queue``."""
        for name, ms in self.queue_retention_ms:
            if name == queue:
                return ms, ms
        return self.run_ttl_ms, self.finished_ttl_ms

    @property
    def initial_partitions(self) -> int:
        """The count to create at first start: the explicit one, else the default."""
        return self.partitions or defaults.PARTITIONS

    @property
    def strict_partitions(self) -> bool:
        """Only an explicit count must match the stored one."""
        return bool(self.partitions)

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        d = cls()
        s = cls(
            redis_url=os.environ.get("RSCHED_REDIS_URL", d.redis_url),
            partitions=_int_env("RSCHED_PARTITIONS", 0),
            max_payload_bytes=_int_env("RSCHED_MAX_PAYLOAD_BYTES", d.max_payload_bytes),
            history_len=_int_env("RSCHED_HISTORY_LEN", d.history_len),
            events_maxlen=_int_env("RSCHED_EVENTS_MAXLEN", d.events_maxlen),
            events_keep=_int_env("RSCHED_EVENTS_KEEP", d.events_keep),
            events_keep_ms=_int_env("RSCHED_EVENTS_KEEP_MS", d.events_keep_ms),
            run_ttl_ms=_int_env("RSCHED_RUN_TTL_MS", d.run_ttl_ms),
            finished_ttl_ms=_int_env("RSCHED_FINISHED_TTL_MS", d.finished_ttl_ms),
            queue_retention_ms=_retention_env("RSCHED_QUEUE_RETENTION_MS"),
            allow_unsafe_redis=os.environ.get("RSCHED_ALLOW_UNSAFE_REDIS", "") in ("1", "true"),
            wait_replicas=_int_env("RSCHED_WAIT_REPLICAS", d.wait_replicas),
            wait_timeout_ms=_int_env("RSCHED_WAIT_TIMEOUT_MS", d.wait_timeout_ms),
            stats_sample_ms=_int_env("RSCHED_STATS_SAMPLE_MS", d.stats_sample_ms),
        )
        known = {f.name for f in fields(cls)}
        s = replace(s, **{k: v for k, v in overrides.items() if k in known and v is not None})
        if not 0 <= s.partitions <= 1024:
            raise ValidationError("RSCHED_PARTITIONS", "must be between 1 and 1024")
        if s.wait_replicas < -1:
            raise ValidationError("RSCHED_WAIT_REPLICAS", "must be -1 (by URL), 0 or more")
        if s.events_keep < 0:
            raise ValidationError("RSCHED_EVENTS_KEEP", "must be 0 (no length bound) or more")
        if s.events_keep_ms < 0:
            raise ValidationError("RSCHED_EVENTS_KEEP_MS", "must be 0 (no age bound) or more")
        if s.wait_timeout_ms < 1:
            raise ValidationError("RSCHED_WAIT_TIMEOUT_MS", "must be 1 or more")
        if not 100 <= s.stats_sample_ms <= 3_600_000:
            raise ValidationError("RSCHED_STATS_SAMPLE_MS", "must be between 100 and 3600000")
        return s
