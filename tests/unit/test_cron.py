"""Cron fire times across the 2026 DST transitions, as tables of literal UTC instants.

Every expected instant was worked out by hand from these transitions, which
test_transitions_are_where_the_tables_assume finds by scanning ZoneInfo.utcoffset:

  America/New_York     spring 03-08 07:00Z  02:00 EST   -> 03:00 EDT    (02:00-02:59 skipped)
                       autumn 11-01 06:00Z  02:00 EDT   -> 01:00 EST    (01:00-01:59 twice)
  Europe/Berlin        spring 03-29 01:00Z  02:00 CET   -> 03:00 CEST   (02:00-02:59 skipped)
                       autumn 10-25 01:00Z  03:00 CEST  -> 02:00 CET    (02:00-02:59 twice)
  Australia/Lord_Howe  autumn 04-04 15:00Z  02:00 +11   -> 01:30 +10:30 (01:30-01:59 twice)
                       spring 10-03 15:30Z  02:00 +10:30 -> 02:30 +11   (02:00-02:29 skipped)

A UTC start can't lie inside a skipped span, so "at the gap" rows start at the transition
instant itself, where the local clock jumps; "inside" rows start in a repeated span.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from rsched.core.cron import MACROS, CronSchedule, parse_cron, validate_zone
from rsched.core.errors import ScheduleError, ValidationError
from rsched.core.times import ms_to_iso, ms_to_iso_fast, to_ms

NY, BERLIN, LORD_HOWE = "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"
HOURLY, QUARTER = "0 * * * *", "*/15 * * * *"
PERIOD_S = {HOURLY: 3600, QUARTER: 900}


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# fmt: off
# (zone, expr, start, expected fire times)
FIXED_TIME = [
    # New York spring: 02:30 is skipped and fires once when the gap ends, 03:00 EDT.
    (NY, "30 2 * * *", "2026-03-08T04:00:00Z",
     ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]),
    (NY, "30 2 * * *", "2026-03-08T06:59:59Z", ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    (NY, "30 2 * * *", "2026-03-08T07:00:00Z", ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]),
    (NY, "30 1 * * *", "2026-03-08T04:00:00Z",
     ["2026-03-08T06:30:00Z", "2026-03-09T05:30:00Z", "2026-03-10T05:30:00Z"]),
    (NY, "30 1 * * *", "2026-03-08T07:00:00Z", ["2026-03-09T05:30:00Z", "2026-03-10T05:30:00Z"]),
    # New York autumn: 01:30 happens twice and fires at the first (EDT) only, never 06:30Z.
    (NY, "30 1 * * *", "2026-11-01T03:00:00Z",
     ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]),
    (NY, "30 1 * * *", "2026-11-01T05:10:00Z", ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    (NY, "30 1 * * *", "2026-11-01T05:30:00Z", ["2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]),
    (NY, "30 1 * * *", "2026-11-01T06:10:00Z", ["2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]),
    (NY, "30 2 * * *", "2026-11-01T03:00:00Z",
     ["2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z", "2026-11-03T07:30:00Z"]),
    (NY, "30 2 * * *", "2026-11-01T06:10:00Z", ["2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]),
    # Berlin spring: 02:30 is skipped and fires at 03:00 CEST.
    (BERLIN, "30 2 * * *", "2026-03-28T22:00:00Z",
     ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"]),
    (BERLIN, "30 2 * * *", "2026-03-29T01:00:00Z",
     ["2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"]),
    (BERLIN, "30 1 * * *", "2026-03-28T22:00:00Z",
     ["2026-03-29T00:30:00Z", "2026-03-29T23:30:00Z", "2026-03-30T23:30:00Z"]),
    (BERLIN, "30 1 * * *", "2026-03-29T01:00:00Z",
     ["2026-03-29T23:30:00Z", "2026-03-30T23:30:00Z"]),
    # Berlin autumn: 02:30 happens twice and fires at the first (CEST) only, never 01:30Z.
    (BERLIN, "30 2 * * *", "2026-10-24T20:00:00Z",
     ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z", "2026-10-27T01:30:00Z"]),
    (BERLIN, "30 2 * * *", "2026-10-25T00:10:00Z",
     ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
    (BERLIN, "30 2 * * *", "2026-10-25T01:10:00Z",
     ["2026-10-26T01:30:00Z", "2026-10-27T01:30:00Z"]),
    (BERLIN, "30 1 * * *", "2026-10-24T20:00:00Z",
     ["2026-10-24T23:30:00Z", "2026-10-26T00:30:00Z", "2026-10-27T00:30:00Z"]),
    (BERLIN, "30 1 * * *", "2026-10-25T01:10:00Z",
     ["2026-10-26T00:30:00Z", "2026-10-27T00:30:00Z"]),
    # Lord Howe autumn: 01:30 happens twice (+11 at 14:30Z, +10:30 at 15:00Z); first only.
    (LORD_HOWE, "30 1 * * *", "2026-04-04T12:00:00Z",
     ["2026-04-04T14:30:00Z", "2026-04-05T15:00:00Z", "2026-04-06T15:00:00Z"]),
    (LORD_HOWE, "30 1 * * *", "2026-04-04T14:30:00Z",
     ["2026-04-05T15:00:00Z", "2026-04-06T15:00:00Z"]),
    (LORD_HOWE, "30 1 * * *", "2026-04-04T15:10:00Z",
     ["2026-04-05T15:00:00Z", "2026-04-06T15:00:00Z"]),
    (LORD_HOWE, "30 2 * * *", "2026-04-04T12:00:00Z",
     ["2026-04-04T16:00:00Z", "2026-04-05T16:00:00Z", "2026-04-06T16:00:00Z"]),
    (LORD_HOWE, "30 2 * * *", "2026-04-04T15:10:00Z",
     ["2026-04-04T16:00:00Z", "2026-04-05T16:00:00Z"]),
    # Lord Howe spring: only 02:00-02:29 is skipped, so 02:30 is untouched...
    (LORD_HOWE, "30 2 * * *", "2026-10-03T12:00:00Z",
     ["2026-10-03T15:30:00Z", "2026-10-04T15:30:00Z", "2026-10-05T15:30:00Z"]),
    (LORD_HOWE, "30 2 * * *", "2026-10-03T15:30:00Z",
     ["2026-10-04T15:30:00Z", "2026-10-05T15:30:00Z"]),
    (LORD_HOWE, "30 1 * * *", "2026-10-03T12:00:00Z",
     ["2026-10-03T15:00:00Z", "2026-10-04T14:30:00Z", "2026-10-05T14:30:00Z"]),
    (LORD_HOWE, "30 1 * * *", "2026-10-03T15:30:00Z",
     ["2026-10-04T14:30:00Z", "2026-10-05T14:30:00Z"]),
    # ...while 02:00 and 02:15 move to the gap's end, 02:30 +11, and fire there once in all.
    (LORD_HOWE, "0 2 * * *", "2026-10-02T12:00:00Z",
     ["2026-10-02T15:30:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:00:00Z"]),
    (LORD_HOWE, "0,15,30 2 * * *", "2026-10-03T12:00:00Z",
     ["2026-10-03T15:30:00Z", "2026-10-04T15:00:00Z", "2026-10-04T15:15:00Z"]),
    # 6 fields, seconds first: a skipped 02:30:00 fires when the gap ends, like 5 fields.
    (NY, "0 30 2 * * *", "2026-03-08T04:00:00Z", ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
]

ELAPSED_TIME = [
    # New York spring: 01:45 EST is followed by 03:00 EDT, 15 real minutes later.
    (NY, QUARTER, "2026-03-08T06:00:00Z",
     ["2026-03-08T06:15:00Z", "2026-03-08T06:30:00Z", "2026-03-08T06:45:00Z",
      "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z"]),
    (NY, QUARTER, "2026-03-08T07:00:00Z",
     ["2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z", "2026-03-08T07:45:00Z"]),
    (NY, HOURLY, "2026-03-08T04:00:00Z",
     ["2026-03-08T05:00:00Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z",
      "2026-03-08T08:00:00Z"]),
    (NY, HOURLY, "2026-03-08T07:00:00Z",
     ["2026-03-08T08:00:00Z", "2026-03-08T09:00:00Z", "2026-03-08T10:00:00Z"]),
    # New York autumn: both copies of 01:00-01:59 fire, with no 75-minute hole.
    (NY, QUARTER, "2026-11-01T05:00:00Z",
     ["2026-11-01T05:15:00Z", "2026-11-01T05:30:00Z", "2026-11-01T05:45:00Z",
      "2026-11-01T06:00:00Z", "2026-11-01T06:15:00Z", "2026-11-01T06:30:00Z",
      "2026-11-01T06:45:00Z", "2026-11-01T07:00:00Z"]),
    (NY, QUARTER, "2026-11-01T06:10:00Z",
     ["2026-11-01T06:15:00Z", "2026-11-01T06:30:00Z", "2026-11-01T06:45:00Z",
      "2026-11-01T07:00:00Z"]),
    (NY, HOURLY, "2026-11-01T03:00:00Z",
     ["2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z",
      "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"]),
    (NY, HOURLY, "2026-11-01T05:10:00Z",
     ["2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]),
    (NY, HOURLY, "2026-11-01T06:10:00Z",
     ["2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"]),
    # Berlin spring and autumn.
    (BERLIN, QUARTER, "2026-03-29T00:00:00Z",
     ["2026-03-29T00:15:00Z", "2026-03-29T00:30:00Z", "2026-03-29T00:45:00Z",
      "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z"]),
    (BERLIN, QUARTER, "2026-03-29T01:00:00Z",
     ["2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z", "2026-03-29T01:45:00Z"]),
    (BERLIN, HOURLY, "2026-03-28T22:00:00Z",
     ["2026-03-28T23:00:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z",
      "2026-03-29T02:00:00Z"]),
    (BERLIN, HOURLY, "2026-03-29T01:00:00Z",
     ["2026-03-29T02:00:00Z", "2026-03-29T03:00:00Z"]),
    (BERLIN, QUARTER, "2026-10-25T00:00:00Z",
     ["2026-10-25T00:15:00Z", "2026-10-25T00:30:00Z", "2026-10-25T00:45:00Z",
      "2026-10-25T01:00:00Z", "2026-10-25T01:15:00Z", "2026-10-25T01:30:00Z",
      "2026-10-25T01:45:00Z", "2026-10-25T02:00:00Z"]),
    (BERLIN, QUARTER, "2026-10-25T01:10:00Z",
     ["2026-10-25T01:15:00Z", "2026-10-25T01:30:00Z", "2026-10-25T01:45:00Z",
      "2026-10-25T02:00:00Z"]),
    (BERLIN, HOURLY, "2026-10-24T22:00:00Z",
     ["2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z",
      "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"]),
    (BERLIN, HOURLY, "2026-10-25T01:10:00Z",
     ["2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"]),
    # Lord Howe autumn: 01:30 and 01:45 fire in both copies, 15 real minutes apart throughout.
    (LORD_HOWE, QUARTER, "2026-04-04T14:00:00Z",
     ["2026-04-04T14:15:00Z", "2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z",
      "2026-04-04T15:00:00Z", "2026-04-04T15:15:00Z", "2026-04-04T15:30:00Z",
      "2026-04-04T15:45:00Z"]),
    (LORD_HOWE, QUARTER, "2026-04-04T15:10:00Z",
     ["2026-04-04T15:15:00Z", "2026-04-04T15:30:00Z", "2026-04-04T15:45:00Z"]),
    # Lord Howe autumn hourly: 01:00 +11, then 02:00 +10:30 90 real minutes later (the repeated
    # half hour holds no :00), then hourly again.
    (LORD_HOWE, HOURLY, "2026-04-04T12:00:00Z",
     ["2026-04-04T13:00:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z",
      "2026-04-04T16:30:00Z"]),
    (LORD_HOWE, HOURLY, "2026-04-04T15:10:00Z",
     ["2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z", "2026-04-04T17:30:00Z"]),
    # Lord Howe spring: 01:45 +10:30 is followed by 02:30 +11, 15 real minutes later.
    (LORD_HOWE, QUARTER, "2026-10-03T14:30:00Z",
     ["2026-10-03T14:45:00Z", "2026-10-03T15:00:00Z", "2026-10-03T15:15:00Z",
      "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z", "2026-10-03T16:00:00Z"]),
    (LORD_HOWE, QUARTER, "2026-10-03T15:30:00Z",
     ["2026-10-03T15:45:00Z", "2026-10-03T16:00:00Z"]),
    # Lord Howe spring hourly: local 02:00 does not exist: 01:00 +10:30, then 03:00 +11 90 real
    # minutes later.
    (LORD_HOWE, HOURLY, "2026-10-03T12:00:00Z",
     ["2026-10-03T12:30:00Z", "2026-10-03T13:30:00Z", "2026-10-03T14:30:00Z",
      "2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z"]),
    (LORD_HOWE, HOURLY, "2026-10-03T15:30:00Z",
     ["2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z"]),
]
# fmt: on


def case_id(case: tuple[str, str, str, list[str]]) -> str:
    zone, expr, start, _ = case
    return f"{zone.split('/')[1]} {expr} from {start}"


def assert_strictly_increasing(start: str, fires: list[int]) -> None:
    assert fires[0] > ms(start)
    assert all(a < b for a, b in pairwise(fires)), [iso(f) for f in fires]


@pytest.mark.parametrize("case", FIXED_TIME, ids=case_id)
def test_fixed_time_jobs_fire_once_per_local_day_across_dst(
    case: tuple[str, str, str, list[str]],
) -> None:
    zone, expr, start, expected = case
    fires = parse_cron(expr, zone).preview(ms(start), len(expected))
    assert [iso(f) for f in fires] == expected
    assert_strictly_increasing(start, fires)


@pytest.mark.parametrize("case", ELAPSED_TIME, ids=case_id)
def test_wildcard_hour_jobs_follow_real_elapsed_time_across_dst(
    case: tuple[str, str, str, list[str]],
) -> None:
    zone, expr, start, expected = case
    fires = parse_cron(expr, zone).preview(ms(start), len(expected))
    assert [iso(f) for f in fires] == expected
    assert_strictly_increasing(start, fires)
    gaps_s = [(b - a) // 1000 for a, b in pairwise(fires)]
    if zone == LORD_HOWE and expr == HOURLY:
        assert set(gaps_s) <= {3600, 5400} and gaps_s.count(5400) <= 1, gaps_s
    else:
        assert set(gaps_s) == {PERIOD_S[expr]}, gaps_s


TRANSITIONS = [  # (zone, transition instant, interval of the hourly job over it, minutes)
    (NY, "2026-03-08T07:00:00Z", 60),
    (NY, "2026-11-01T06:00:00Z", 60),
    (BERLIN, "2026-03-29T01:00:00Z", 60),
    (BERLIN, "2026-10-25T01:00:00Z", 60),
    (LORD_HOWE, "2026-04-04T15:00:00Z", 90),
    (LORD_HOWE, "2026-10-03T15:30:00Z", 90),
]


def test_transitions_are_where_the_tables_assume() -> None:
    """Scan 2026 hour by hour for offset changes, then find each one's minute."""
    found = []
    for zone in (NY, BERLIN, LORD_HOWE):
        tzinfo = ZoneInfo(zone)

        def offset(t: datetime, tzinfo: ZoneInfo = tzinfo) -> timedelta | None:
            return t.astimezone(tzinfo).utcoffset()

        hour = datetime(2026, 1, 1, tzinfo=UTC)
        while hour.year == 2026:
            hour += timedelta(hours=1)
            if offset(hour) != offset(hour - timedelta(hours=1)):
                minute = hour - timedelta(minutes=59)
                while offset(minute) == offset(hour - timedelta(hours=1)):
                    minute += timedelta(minutes=1)
                found.append((zone, minute.strftime("%Y-%m-%dT%H:%M:%SZ")))
    assert sorted(found) == sorted((zone, at) for zone, at, _ in TRANSITIONS)


@pytest.mark.parametrize(("zone", "transition", "hourly_hole_min"), TRANSITIONS)
def test_a_day_around_each_transition_keeps_the_period(
    zone: str, transition: str, hourly_hole_min: int
) -> None:
    start = ms(transition) - 12 * 3600 * 1000 - 1
    quarters = parse_cron(QUARTER, zone).preview(start, 96)
    assert {b - a for a, b in pairwise(quarters)} == {15 * 60 * 1000}
    hours = parse_cron(HOURLY, zone).preview(start, 24)
    gaps_min = [(b - a) // 60_000 for a, b in pairwise(hours)]
    assert sorted(set(gaps_min)) == sorted({60, hourly_hole_min})
    assert sum(1 for g in gaps_min if g != 60) == (hourly_hole_min != 60)


@pytest.mark.parametrize(("zone", "transition", "hourly_hole_min"), TRANSITIONS)
@pytest.mark.parametrize("expr", [HOURLY, QUARTER, "*/30 * * * *"])
def test_every_start_near_a_transition_gets_the_next_matching_instant(
    zone: str, transition: str, hourly_hole_min: int, expr: str
) -> None:
    """Oracle: scan UTC minutes and keep those whose local wall time matches the minute field."""
    tzinfo, step = ZoneInfo(zone), PERIOD_S.get(expr, 1800) // 60
    lo = ms(transition) // 1000 - 3 * 3600
    fires = [
        t
        for t in range(lo, lo + 8 * 3600, 60)
        if datetime.fromtimestamp(t, tzinfo).minute % step == 0
    ]
    schedule = parse_cron(expr, zone)
    for start_s in range(lo, lo + 6 * 3600, 7 * 60 + 3):
        for start_ms in (start_s * 1000, start_s * 1000 + 999):
            assert schedule.next_after(start_ms) == 1000 * min(f for f in fires if f > start_s)


# fmt: off
FIXED_SPANS = [  # (zone, expr, every fire from the first to the last)
    (NY, "30 1 * * *", ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    (NY, "30 2 * * *", ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    (BERLIN, "30 2 * * *", ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z",
                            "2026-10-26T01:30:00Z"]),
    (LORD_HOWE, "30 1 * * *", ["2026-04-03T14:30:00Z", "2026-04-04T14:30:00Z",
                               "2026-04-05T15:00:00Z"]),

]
# fmt: on


@pytest.mark.parametrize(("zone", "expr", "fires"), FIXED_SPANS)
def test_every_start_between_fixed_fires_gets_the_next_one(
    zone: str, expr: str, fires: list[str]
) -> None:
    """Starts every few minutes, including inside repeated hours where cronsim goes back."""
    schedule, fire_ms = parse_cron(expr, zone), [ms(f) for f in fires]
    for start in range(fire_ms[0], fire_ms[-1], 7 * 60_000 + 3):
        assert schedule.next_after(start) == min(f for f in fire_ms if f > start)


def test_a_sparse_job_sees_the_summer_between_its_start_and_its_next_fire() -> None:
    """From February (EST), Nov 1 01:00 read with EST is 06:00Z, the second 01:00; the first
    01:00 (EDT, 05:00Z) comes earlier and only shows up by tracking the summer in between."""
    fires = parse_cron("*/30 1 1 11 *", NY).preview(ms("2026-02-01T00:00:00Z"), 5)
    assert [iso(f) for f in fires] == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:30:00Z",
        "2027-11-01T05:00:00Z",
    ]


def test_cronsim_alone_goes_back_or_skips_when_it_starts_in_a_repeated_span() -> None:
    """Why the module maps wall times itself: cronsim 2.8 loses the fold (01:10 EST here)."""
    start = datetime.fromtimestamp(ms("2026-11-01T06:10:00Z") / 1000, ZoneInfo(NY))
    assert next(CronSim("30 1 * * *", start)).timestamp() < start.timestamp()  # 05:30Z
    lord_howe = datetime.fromtimestamp(ms("2026-04-04T15:05:00Z") / 1000, ZoneInfo(LORD_HOWE))
    skipped = next(CronSim("0 */2 * * *", lord_howe))  # 04:00 +10:30, not 02:00 +10:30
    assert iso(int(skipped.timestamp() * 1000)) == "2026-04-04T17:30:00Z"
    assert iso(parse_cron("0 */2 * * *", LORD_HOWE).next_after(ms("2026-04-04T15:05:00Z"))) == (
        "2026-04-04T15:30:00Z"
    )
    assert iso(parse_cron("30 1 * * *", NY).next_after(ms("2026-11-01T06:10:00Z"))) == (
        "2026-11-02T06:30:00Z"
    )


def test_fire_times_are_strictly_after_the_start_to_the_millisecond() -> None:
    schedule, fire = parse_cron(QUARTER, "UTC"), ms("2026-06-01T12:15:00Z")
    assert schedule.next_after(fire - 1) == fire
    assert schedule.next_after(fire) == fire + 15 * 60_000
    assert schedule.next_after(fire - 15 * 60_000 + 1) == fire


def test_six_fields_put_seconds_first() -> None:
    every_20_s = parse_cron("*/20 * * * * *", "UTC").preview(ms("2026-06-01T00:00:00Z"), 3)
    assert [iso(f) for f in every_20_s] == [
        "2026-06-01T00:00:20Z",
        "2026-06-01T00:00:40Z",
        "2026-06-01T00:01:00Z",
    ]
    noon_30_s = parse_cron("30 0 12 * * *", NY).next_after(ms("2026-06-01T00:00:00Z"))
    assert iso(noon_30_s) == "2026-06-01T16:00:30Z"  # 12:00:30 EDT


def test_parse_cron_is_cached_and_schedules_compare_by_value() -> None:
    assert parse_cron(HOURLY, NY) is parse_cron(HOURLY, NY)
    assert CronSchedule(HOURLY, NY) == parse_cron(HOURLY, NY)
    assert parse_cron(QUARTER, NY).preview(0, 0) == []


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("* * *", "expected 5 or 6 fields, got 3"),
        ("0 0 0 * * * *", "expected 5 or 6 fields, got 7"),
        ("61 * * * *", "bad minute field '61'"),
        ("* 24 * * *", "bad hour field '24'"),
        ("0 0 0 * *", "bad day-of-month field '0'"),
        ("0 0 * 13 *", "bad month field '13'"),
        ("0 0 * * 8", "bad day-of-week field '8'"),
        ("*/0 * * * *", "bad minute field '*/0'"),
        ("5-1 * * * *", "bad minute field '5-1'"),
        ("a b c d e", "bad minute field 'a'"),
        ("60 * * * * *", "bad second field '60'"),
        ("0 0 30 2 *", "never fires: no date matches its day-of-month, month and day-of-week"),
        ("0 0 31 4,6 *", "never fires: no date matches its day-of-month, month and day-of-week"),
        ("0 0 */15 2 5#5", "never fires: no date matches its day-of-month, month and day-of-week"),
    ],
)
def test_bad_cron_expressions_name_the_cron_field_and_say_why(expr: str, reason: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_cron(expr, NY)
    assert (caught.value.field, caught.value.reason) == ("cron", reason)
    assert isinstance(caught.value, ValidationError)
    assert str(caught.value) == f"cron: {reason}"


@pytest.mark.parametrize(
    ("tz", "reason"),
    [
        ("Mars/Base", "unknown time zone 'Mars/Base'"),
        ("", "must not be empty"),
        ("America", "unknown time zone 'America'"),
        ("../etc/passwd", "unknown time zone '../etc/passwd'"),
        ("/etc/localtime", "unknown time zone '/etc/localtime'"),
    ],
)
def test_unknown_time_zones_name_the_time_zone_field(tz: str, reason: str) -> None:
    for call in (lambda: validate_zone(tz), lambda: parse_cron(HOURLY, tz)):
        with pytest.raises(ScheduleError) as caught:
            call()
        assert (caught.value.field, caught.value.reason) == ("timeZone", reason)


def test_validate_zone_returns_the_zone() -> None:
    assert validate_zone(LORD_HOWE) == ZoneInfo(LORD_HOWE)


@pytest.mark.parametrize("ms", [None, 0, 1, 999, 1000, 1_700_000_000_123, 951_782_400_000,
                                253_402_300_799_999, 86_399_999])
def test_the_fast_iso_formatter_writes_what_the_plain_one_writes(ms: int | None) -> None:
    assert ms_to_iso_fast(ms) == ms_to_iso(ms)
    if ms is not None:
        assert to_ms(ms_to_iso(ms), "t") == ms


@pytest.mark.parametrize(
    ("macro", "zone", "start", "fires"),
    [
        ("@yearly", "UTC", "2026-06-01T00:00:00Z",
         ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
        ("@annually", NY, "2026-06-01T00:00:00Z", ["2027-01-01T05:00:00Z", "2028-01-01T05:00:00Z"]),
        ("@monthly", BERLIN, "2026-02-15T00:00:00Z",
         ["2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"]),  # CET, then CEST from 03-29
        ("@weekly", "UTC", "2026-06-01T00:00:00Z",
         ["2026-06-07T00:00:00Z", "2026-06-14T00:00:00Z"]),
        ("@daily", NY, "2026-03-07T06:00:00Z", ["2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"]),
        ("@midnight", "UTC", "2026-06-01T00:00:00Z",
         ["2026-06-02T00:00:00Z", "2026-06-03T00:00:00Z"]),
        # Elapsed time across New York's autumn night: 01:00 EDT and 01:00 EST both fire.
        ("@hourly", NY, "2026-11-01T04:30:00Z",
         ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]),
        (" @DAILY ", "UTC", "2026-06-01T00:00:00Z",
         ["2026-06-02T00:00:00Z", "2026-06-03T00:00:00Z"]),
    ],
)
def test_cron_macros_fire_like_their_five_field_forms(
    macro: str, zone: str, start: str, fires: list[str]
) -> None:
    got = parse_cron(macro, zone).preview(ms(start), len(fires))
    assert [iso(f) for f in got] == fires
    plain = parse_cron(MACROS[macro.strip().lower()], zone).preview(ms(start), len(fires))
    assert got == plain


@pytest.mark.parametrize("expr", ["@reboot", "@every 5m", "@"])
def test_unknown_cron_macros_name_the_cron_field(expr: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_cron(expr, "UTC")
    assert caught.value.field == "cron"
    assert caught.value.reason.startswith(f"unknown macro {expr!r}; expected one of @yearly")
