"""Cron fire times in an IANA time zone, as UTC epoch milliseconds.

We use cronsim 2.8, not croniter 7.0: croniter fires fixed-time jobs twice on fall-back nights (New
York `30 1 * * *` fires at 05:30Z and 06:30Z on 2026-11-01) and is several times slower. cronsim
only matches naive local wall-clock times here; this module maps them to instants itself, because
cronsim's own DST handling can return a time before its start when the start lies in a repeated hour
(`30 1 * * *` from New York 01:10 EST on 2026-11-01 gives 05:30Z) and skips fire times on 30-minute
zones (`0 */2 * * *` on Lord Howe skips 02:00 on 2026-04-05).

Expressions have 5 fields, `minute hour day-of-month month day-of-week` (second 0), or 6 fields
with seconds FIRST, `second minute hour day-of-month month day-of-week` (cronsim's convention;
croniter reads a sixth field as seconds last). Names (JAN, MON), `L`, `LW` and `#` work as in
cronsim. The macros `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`) and
`@hourly` stand for their 5-field forms (MACROS) and follow the same DST rules: `@daily` is a
fixed-time job at 00:00, `@hourly` follows elapsed time.

DST contract (each rule has a table in tests/unit/test_cron.py):
* Fixed-time jobs (minute and hour fields are numbers or comma lists of numbers): a wall time in a
  gap fires once, at the instant the gap ends (New York `30 2` on 2026-03-08: 03:00 EDT = 07:00Z;
  Lord Howe `0 2` on 2026-10-04: 02:30 LHDT); a wall time in a repeated span fires once, at its
  first occurrence (New York `30 1` on 2026-11-01: 05:30Z, never 06:30Z).
* Every other job fires at each instant whose local wall time matches: through both copies of a
  repeated span, never inside a gap. With whole-hour shifts, `*/15` and hourly jobs keep their
  real-time period across both transitions. With Lord Howe's 30-minute shift `*/15` and `*/30`
  still do, but an hourly job has one 90-minute interval at each transition (in spring local
  02:00 does not exist; in autumn the repeated 01:30-02:00 holds no :00).
* `next_after(t) > t` always, so `t = next_after(t)` never repeats an instant.

Cost: next_after is close to a bare `next(CronSim(...))`, whose parsing and ticking is most of it;
an answer across a transition adds a second cronsim run and a bisection, and a rarely firing job
that is not fixed-time pays offset probes per day until its next fire (under 1 ms a year ahead).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from cronsim.cronsim import Field

from rsched.core.errors import ScheduleError

__all__ = ["MACROS", "CronSchedule", "parse_cron", "validate_zone"]

MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Cron macros and the 5-field form each stands for (the stored job keeps the macro)."""

_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)
_DAY_S = 86_400
_FIXED_FIELD = re.compile(r"\d+(?:,\d+)*")
_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
# Any pattern that fires at all fires within 2000-2050: 2000 is a leap year and weekdays repeat
# every 28 years; cronsim gives up after 50 years.
_PROBE_START = datetime(2000, 1, 1)


def validate_zone(tz: str) -> ZoneInfo:
    """Return the zone, or raise a ScheduleError on `timeZone` that the API can show as is."""
    if not tz:
        raise ScheduleError("timeZone", "must not be empty")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError("timeZone", f"unknown time zone {tz!r}") from None


def _check_cron(expr: str) -> list[str]:
    """Validate field by field, so the reason names the bad field instead of cronsim's guess."""
    if expr.lstrip().startswith("@"):
        raise ScheduleError("cron", f"unknown macro {expr!r}; expected one of "
                                    + ", ".join(MACROS))
    parts = expr.split()
    if not parts:
        raise ScheduleError("cron", "must not be empty")
    if len(parts) not in (5, 6):
        raise ScheduleError("cron", f"expected 5 or 6 fields, got {len(parts)}")
    for index, part in enumerate(parts, start=6 - len(parts)):
        try:
            Field(index).parse(part.upper())
        except CronSimError:
            raise ScheduleError("cron", f"bad {_FIELD_NAMES[index]} field {part!r}") from None
    try:  # the fields are valid, so cronsim fails only on dates that never occur (`0 0 30 2 *`)
        next(CronSim(expr, _PROBE_START))
    except (CronSimError, StopIteration):
        raise ScheduleError(
            "cron", "never fires: no date matches its day-of-month, month and day-of-week"
        ) from None
    return parts


def _offset_s(zone: ZoneInfo, t: int) -> int:
    """UTC offset in seconds at epoch second `t`."""
    return _utcoffset_s(zone, datetime.fromtimestamp(t, zone))


def _utcoffset_s(zone: ZoneInfo, wall: datetime) -> int:
    """Offset at a naive or aware wall time; in a repeated or skipped span, `fold` 0 gives the
    offset before the transition and 1 the one after (PEP 495)."""
    offset = zone.utcoffset(wall)
    assert offset is not None  # ZoneInfo always has one; the stub says Optional
    return offset // _SECOND


def _first_change(zone: ZoneInfo, lo: int, hi: int, offset_s: int) -> int | None:
    """First second in (lo, hi] whose offset is not `offset_s`, given that `lo` has it.

    Probes one day apart, then bisects: offset changes are at least 6.9 days apart in every
    tzdata zone since 1970, so a change and its undoing can't hide between two probes.
    """
    probe = lo
    while probe < hi:
        before, probe = probe, min(probe + _DAY_S, hi)
        if _offset_s(zone, probe) != offset_s:
            while probe - before > 1:
                middle = (before + probe) // 2
                if _offset_s(zone, middle) == offset_s:
                    before = middle
                else:
                    probe = middle
            return probe
    return None


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A validated cron expression in an IANA zone; build it with parse_cron, which caches."""

    expr: str
    tz: str
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _fixed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _check_cron(self.expr)
        object.__setattr__(self, "_zone", validate_zone(self.tz))
        minute, hour = parts[-5], parts[-4]
        fixed = bool(_FIXED_FIELD.fullmatch(minute) and _FIXED_FIELD.fullmatch(hour))
        object.__setattr__(self, "_fixed", fixed)

    def next_after(self, after_ms: int) -> int:
        """First fire time strictly after `after_ms` (UTC ms); DST rules in the module docstring."""
        after_s = after_ms // 1000  # fire times are whole seconds: > after_s means > after_ms
        return 1000 * (self._next_fixed(after_s) if self._fixed else self._next_elapsed(after_s))

    def preview(self, after_ms: int, count: int) -> list[int]:
        """The next `count` fire times after `after_ms`, for the API and the dashboard."""
        fires: list[int] = []
        for _ in range(count):
            after_ms = self.next_after(after_ms)
            fires.append(after_ms)
        return fires

    def _next_fixed(self, after_s: int) -> int:
        """Walk wall times; skip those whose first occurrence is not after `after_s`.

        Such wall times exist when `after_s` lies in the second copy of a repeated span: the
        naive wall time forgot which copy, which is the cronsim bug this module works around.
        """
        wall = _EPOCH + timedelta(seconds=after_s + _offset_s(self._zone, after_s))
        for naive in CronSim(self.expr, wall):
            fire_s = self._instant(naive)
            if fire_s > after_s:
                return fire_s
        raise ScheduleError("cron", "no fire time within 50 years")

    def _instant(self, naive: datetime) -> int:
        """Map a wall time: first occurrence if repeated, the end of the gap if skipped."""
        local_s = (naive - _EPOCH) // _SECOND
        before_s = _utcoffset_s(self._zone, naive)  # fold=0: the offset before a transition
        fire_s = local_s - before_s
        actual_s = _offset_s(self._zone, fire_s)
        if actual_s == before_s:  # a real wall time, and its first occurrence if repeated
            return fire_s
        # Skipped: the gap ends between local_s read with the offset after it and before it.
        gap_end = _first_change(self._zone, local_s - actual_s, fire_s, before_s)
        return fire_s if gap_end is None else gap_end

    def _next_elapsed(self, after_s: int) -> int:
        """Per stretch of constant offset, cronsim's first wall match after `t` is the answer
        if it maps back into the same stretch; otherwise restart where the offset changes."""
        t = after_s + 1
        while True:
            offset_s = _offset_s(self._zone, t)
            wall = _EPOCH + timedelta(seconds=t + offset_s - 1)  # cronsim ticks 1 s first
            naive = next(CronSim(self.expr, wall), None)
            if naive is None:
                raise ScheduleError("cron", "no fire time within 50 years")
            fire_s = (naive - _EPOCH) // _SECOND - offset_s
            change = _first_change(self._zone, t, fire_s, offset_s)
            if change is None:
                return fire_s
            t = change


@lru_cache(maxsize=4096)
def parse_cron(expr: str, tz: str) -> CronSchedule:
    """Validate once per (expr, tz): the dispatcher calls this for every job it schedules.
    A macro (MACROS) is read as its 5-field form, so it shares that form's DST rules."""
    return CronSchedule(MACROS.get(expr.strip().lower(), expr), tz)
