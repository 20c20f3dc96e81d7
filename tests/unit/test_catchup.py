"""Catch-up planning (rsched.core.catchup) as tables: which occurrence a late claim runs, where the
schedule goes next, and the gap it records."""

from __future__ import annotations

import pytest

from rsched.core.catchup import GAP_WALK, CatchUp, Gap, plan_catch_up
from rsched.core.cron import parse_cron

S = 1000
T0 = 1_780_000_000_000  # a multiple of 5 s and of 1 s: an occurrence of both schedules below
EVERY_5S = parse_cron("*/5 * * * * *", "UTC").next_after
EVERY_S = parse_cron("* * * * * *", "UTC").next_after


# fmt: off
# (now - T0 in s, window s, run_once, expected plan) for a job every 5 s whose next is T0
TABLE = [
    # on time, and late inside the window: the occurrence itself runs, next is its successor
    (0, 60, True, CatchUp(T0, T0 + 5 * S, None)),
    (60, 60, True, CatchUp(T0, T0 + 5 * S, None)),  # late by exactly the window: still inside
    (60, 60, False, CatchUp(T0, T0 + 5 * S, None)),
    # 61 s late, 60 s window: T0 is the only old one; run_once runs it, skip records it
    (61, 60, True, CatchUp(T0, T0 + 5 * S, None)),
    (61, 60, False, CatchUp(None, T0 + 5 * S, Gap(1, T0, T0))),
    # stopped 30 s, 10 s window: T0..T0+15 are older than 10 s (cutoff T0+20)
    (30, 10, False, CatchUp(None, T0 + 20 * S, Gap(4, T0, T0 + 15 * S))),
    (30, 10, True, CatchUp(T0 + 15 * S, T0 + 20 * S, Gap(3, T0, T0 + 10 * S))),
    # the same stop with the default 60 s window loses nothing
    (30, 60, True, CatchUp(T0, T0 + 5 * S, None)),
    # a zero window: anything late at all is a gap
    (7, 0, False, CatchUp(None, T0 + 10 * S, Gap(2, T0, T0 + 5 * S))),
]
# fmt: on


@pytest.mark.parametrize(("late_s", "window_s", "run_once", "plan"), TABLE)
def test_a_late_claim_runs_what_the_window_allows_and_records_the_rest_once(
    late_s: int, window_s: int, run_once: bool, plan: CatchUp
) -> None:
    assert plan_catch_up(EVERY_5S, T0, T0 + late_s * S, window_s * S, run_once) == plan


def test_after_an_outage_every_occurrence_inside_the_window_runs_once_in_order() -> None:
    """Claim by claim, as the dispatcher does: stopped 30 s, 60 s window."""
    now, expected, ran = T0 + 30 * S, T0, []
    while expected <= now:
        plan = plan_catch_up(EVERY_5S, expected, now, 60 * S, True)
        assert plan.gap is None and plan.run_ms is not None
        ran.append(plan.run_ms)
        expected = plan.next_ms
    assert ran == [T0 + k * 5 * S for k in range(7)]  # T0 .. T0+30, each once
    assert expected == T0 + 35 * S


def test_after_an_outage_a_narrow_window_records_one_gap_then_runs_the_rest() -> None:
    now, expected, ran, gaps = T0 + 30 * S, T0, [], []
    while expected <= now:
        plan = plan_catch_up(EVERY_5S, expected, now, 10 * S, False)
        gaps += [plan.gap] if plan.gap else []
        ran += [plan.run_ms] if plan.run_ms is not None else []
        expected = plan.next_ms
    assert gaps == [Gap(4, T0, T0 + 15 * S)]
    assert ran == [T0 + 20 * S, T0 + 25 * S, T0 + 30 * S]


@pytest.mark.parametrize("run_once", [True, False])
def test_a_gap_longer_than_the_walk_is_searched_and_marked_inexact(run_once: bool) -> None:
    """An every-second job down for a day: no 86,400-step walk, and the schedule resumes at the
    window."""
    now = T0 + 86_400 * S
    calls = 0

    def counted(t: int) -> int:
        nonlocal calls
        calls += 1
        return EVERY_S(t)

    plan = plan_catch_up(counted, T0, now, 60 * S, run_once)
    last_old = now - 60 * S - S  # the cutoff itself is inside the window
    assert plan.next_ms == now - 60 * S
    assert plan.gap is not None and not plan.gap.exact and plan.gap.size == GAP_WALK
    assert plan.gap.first_ms == T0
    if run_once:
        assert (plan.run_ms, plan.gap.last_ms) == (last_old, last_old - S)
    else:
        assert (plan.run_ms, plan.gap.last_ms) == (None, last_old)
    assert calls < GAP_WALK + 100


def test_a_daily_job_missed_for_a_week_runs_the_latest_day_once() -> None:
    daily = parse_cron("0 3 * * *", "Europe/Berlin").next_after
    first = daily(T0)
    now = first + 7 * 86_400 * S + 3600 * S  # an hour after the eighth 03:00
    plan = plan_catch_up(daily, first, now, 60 * S, True)
    eighth = first + 7 * 86_400 * S  # no DST change in the week after 2026-05-28
    assert plan.run_ms == eighth and plan.next_ms == daily(eighth)
    assert plan.gap == Gap(7, first, eighth - 86_400 * S)
