"""Catch-up planning for a recurring job whose occurrence is claimed late (pure; the dispatcher's
claim round calls it once per due recurring job).

An occurrence missed by less than the job's catch-up window runs, with its nominal time, and the
schedule moves on to the next nominal occurrence, which may be due already: after an outage every
missed occurrence inside the window runs once, in order, one per claim round.  Occurrences older
than the window form a gap, recorded once (count and range) and skipped, except that with
misfire=run_once the latest of them runs once.  The schedule never stops over a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

GAP_WALK = 1000  # occurrences of a gap walked one by one (a cron step each); past that, a search


class Gap(NamedTuple):
    """Occurrences older than the catch-up window, skipped together."""

    size: int  # how many occurrences (a lower bound when not exact)
    first_ms: int
    last_ms: int
    exact: bool = True  # False: the gap had more than GAP_WALK occurrences, size is GAP_WALK


class CatchUp(NamedTuple):
    run_ms: int | None  # the occurrence to run now (its nominal time), None: none
    next_ms: int  # the job's next nominal occurrence after this claim
    gap: Gap | None  # skipped occurrences to record, None: none


def plan_catch_up(next_after: Callable[[int], int], expected_ms: int, now_ms: int,
                  window_ms: int, run_once: bool) -> CatchUp:
    """What a claim at ``now_ms`` does with the occurrence due at ``expected_ms``.

    ``next_after`` is the schedule's (CronSchedule.next_after).  An occurrence at t is inside the
    window when now - t <= window_ms.  On time or inside the window this costs one next_after
    call, as a plain claim does."""
    cutoff = now_ms - window_ms
    following = next_after(expected_ms)
    if expected_ms >= cutoff:
        return CatchUp(expected_ms, following, None)
    # expected_ms starts a gap: walk to its last occurrence (the one before the window).
    count, prev, last = 1, 0, expected_ms
    while following < cutoff and count < GAP_WALK:
        count, prev, last, following = count + 1, last, following, next_after(following)
    exact = following >= cutoff
    if not exact:
        last = _last_before(next_after, cutoff, last)
        prev = _last_before(next_after, last, expected_ms)
        following = next_after(last)
    if not run_once:
        return CatchUp(None, following, Gap(count, expected_ms, last, exact))
    if count == 1:
        return CatchUp(last, following, None)
    return CatchUp(last, following, Gap(count - exact, expected_ms, prev, exact))


def _last_before(next_after: Callable[[int], int], bound: int, known: int) -> int:
    """The last occurrence before ``bound``, given ``known``, an earlier one: probe back from the
    bound in doubling steps until a probe finds one, then step forward."""
    step = 1000
    t = next_after(max(bound - 1 - step, known))
    while t >= bound and bound - 1 - step > known:
        step *= 2
        t = next_after(max(bound - 1 - step, known))
    last = t if t < bound else known
    for _ in range(GAP_WALK):
        nxt = next_after(last)
        if nxt >= bound:
            break
        last = nxt
    return last
