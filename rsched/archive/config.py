"""Archiver settings and the backoff it retries an unavailable store with."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, fields
from typing import Any

from rsched.archive.store import archive_url
from rsched.core.errors import ValidationError


@dataclass(frozen=True, slots=True)
class ArchiverConfig:
    """Archiver settings; ``from_env`` reads ``RSCHED_ARCHIVE_*`` and names a bad variable."""

    url: str = ""
    # Store URL (RSCHED_ARCHIVE_URL): postgresql://... or sqlite:///path; "" = embedded SQLite.
    batch: int = 2000
    # Entries read per partition per round (RSCHED_ARCHIVE_BATCH): larger = fewer commits.
    poll_ms: int = 200
    # Wait after a round that found nothing (RSCHED_ARCHIVE_POLL_MS): the lag floor when idle.
    claim_idle_ms: int = 60_000
    # Entries delivered but unacknowledged this long belong to a dead archiver
    # (RSCHED_ARCHIVE_CLAIM_IDLE_MS); keep it well above the time one batch can take.
    retention_days: int = 30
    # History kept, by the day Redis recorded the event (RSCHED_ARCHIVE_RETENTION_DAYS); 0 = all.
    backlog_warn: int = 100_000
    # Warn when this many events wait in Redis (RSCHED_ARCHIVE_BACKLOG_WARN): Redis memory.
    backoff_base_ms: int = 200
    backoff_cap_ms: int = 30_000
    # Retry delays while the store is unavailable: base * 2^n with jitter, capped.

    @classmethod
    def from_env(cls, **overrides: Any) -> ArchiverConfig:
        values: dict[str, Any] = {"url": archive_url(overrides.pop("url", None))}
        for f in fields(cls):
            if f.name == "url":
                continue
            name = f"RSCHED_ARCHIVE_{f.name.upper()}"
            raw = os.environ.get(name, "")
            if raw:
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise ValidationError(name, f"expected an integer, got {raw!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)
        for name, low in (("batch", 1), ("poll_ms", 1), ("claim_idle_ms", 1), ("retention_days", 0),
                          ("backlog_warn", 1), ("backoff_base_ms", 1), ("backoff_cap_ms", 1)):
            if getattr(config, name) < low:
                raise ValidationError(f"RSCHED_ARCHIVE_{name.upper()}", f"must be >= {low}")
        return config


class Backoff:
    """Capped exponential backoff with jitter (half to full delay)."""

    def __init__(self, base_ms: int, cap_ms: int) -> None:
        self.base_ms, self.cap_ms, self.failures = base_ms, cap_ms, 0

    def next_s(self) -> float:
        delay = min(self.cap_ms, self.base_ms << min(self.failures, 30))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0) / 1000

    def reset(self) -> None:
        self.failures = 0


__all__ = ["ArchiverConfig", "Backoff"]
