"""Retry delays: capped exponential backoff with full jitter (pure functions, table-tested)."""

from __future__ import annotations

import random


def backoff_ceiling_ms(attempt: int, base_ms: int, cap_ms: int) -> int:
    """min(base * 2^attempt, cap): the largest delay after failed attempt number ``attempt``."""
    if attempt >= 62:
        return cap_ms
    return min(base_ms * (1 << max(attempt, 0)), cap_ms)


def retry_delay_ms(
    attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None
) -> int:
    """Full jitter: uniform in [0, ceiling], so a burst of failures does not retry in lockstep."""
    ceiling = backoff_ceiling_ms(attempt, base_ms, cap_ms)
    return int((rng or random).uniform(0, ceiling))
