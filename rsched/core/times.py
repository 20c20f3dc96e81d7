"""Times as rsched passes them: integer ms since the epoch (UTC) in, ISO-8601 with Z out."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from rsched.core.errors import ValidationError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(value: Any, field: str) -> int:
    """Accept epoch ms (int), an aware datetime, or an ISO-8601 string with an offset or Z."""
    if isinstance(value, bool):
        raise ValidationError(field, "expected a time, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValidationError(field, f"not an ISO-8601 time: {value!r}") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValidationError(field, "time needs a UTC offset or Z (ambiguous otherwise)")
        return int(value.timestamp() * 1000)
    raise ValidationError(field, f"expected an ISO-8601 time, got {type(value).__name__}")


def ms_to_iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    dt = _EPOCH + timedelta(milliseconds=ms)  # exact: no float seconds
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@lru_cache(maxsize=65536)
def ms_to_iso_fast(ms: int | None) -> str | None:
    """ms_to_iso without datetime, cached (a page's jobs share their creation and run times):
    what the API's job listings format per field.  tests/unit/test_cron.py compares the two."""
    if ms is None:
        return None
    s, frac = divmod(ms, 1000)
    t = time.gmtime(s)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:"
            f"{t.tm_sec:02d}.{frac:03d}Z")
