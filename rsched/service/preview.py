"""Cron previews: the next fire times of an expression, or of a job with its lifecycle limits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rsched.core.cron import parse_cron, validate_zone
from rsched.core.errors import ScheduleError, ValidationError
from rsched.core.lifecycle import skip_reason
from rsched.core.models import Job
from rsched.core.times import ms_to_iso

MAX_PREVIEW = 100
PREVIEW_MIN_MS = 0
PREVIEW_MAX_MS = 7_258_118_400_000  # 2200-01-01: cron walks stay far from datetime's year 9999


def job_fire_times(job: Job, from_ms: int, count: Any) -> list[dict[str, str]]:
    """fire_times of a job's cron in its zone, each time its startAt, endAt or maxRuns would not
    run marked ``skipped`` with the reason (core.lifecycle.skip_reason)."""
    if not job.cron:
        raise ValidationError("jobId", "a one-off job has no schedule to preview")
    times = fire_times(job.cron, job.tz, from_ms, count)
    kept = 0
    for t, at in zip(times, _preview_ms(job.cron, job.tz, from_ms, len(times)), strict=True):
        reason = skip_reason(at, kept, job.life, job.runs)
        if reason is None:
            kept += 1
        else:
            t["skipped"] = reason
    return times


def _preview_ms(cron: str, tz: str, from_ms: int, count: int) -> list[int]:
    out, at, schedule = [], from_ms, parse_cron(cron, tz)
    for _ in range(count):
        at = schedule.next_after(at)
        out.append(at)
    return out


def fire_times(cron: Any, tz: Any, from_ms: int, count: Any) -> list[dict[str, str]]:
    """The next `count` fire times after `from_ms`, in UTC and in the job's zone."""
    if not isinstance(cron, str):
        raise ValidationError("cron", "required: a cron expression such as '30 2 * * *'")
    if not isinstance(tz, str):
        raise ValidationError("timeZone", "must be an IANA time zone such as 'Europe/Berlin'")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PREVIEW:
        raise ValidationError("count", f"must be an integer between 1 and {MAX_PREVIEW}")
    if not PREVIEW_MIN_MS <= from_ms <= PREVIEW_MAX_MS:
        raise ValidationError("from", "must be between 1970 and 2200")
    schedule = parse_cron(cron, tz)
    zone = validate_zone(tz)
    times: list[dict[str, str]] = []
    at = from_ms
    for _ in range(count):
        try:
            at = schedule.next_after(at)
        except (ScheduleError, OverflowError, ValueError):
            if not times:
                raise ScheduleError("cron", "no fire time within 50 years") from None
            break  # the calendar ran out (a rare date far ahead): return what there is
        times.append({"utc": ms_to_iso(at) or "",
                      "local": datetime.fromtimestamp(at / 1000, zone).isoformat()})
    return times
