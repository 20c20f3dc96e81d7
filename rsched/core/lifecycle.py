"""A job's lifecycle limits (pure): the window its recurring occurrences fall in (startAt,
endAt), how many runs it takes (maxRuns), when failures pause it (pauseAfterFailures) and how
late a one-off job may start (startDeadlineSeconds).

They travel as the last element of the packed spec (models.SPEC_ORDER's ``life``): nil for a
job without any, so the hot one-off path pays one byte, and otherwise the text
``L<start>,<end>,<maxRuns>,<deadline>,<pauseAfter>``, which the Lua scripts read off the spec's
end with one pattern (lua/include/life.lua; Redis's cmsgpack cannot decode the spec's binary
payload) where they enforce maxRuns, pauseAfterFailures and the start deadline.  startAt and
endAt are applied here, in Python, where the recurring next times are computed (bounded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

NEVER_MS = 1 << 62
"""What a bounded schedule's next_after returns when no occurrence is left: later than every
time, so the catch-up walk (core.catchup) stops at it; stored as next_ms 0 (none)."""


class Life(NamedTuple):
    """0 in a field means "no limit"; the order is the Lua scripts' (lua/include/life.lua)."""

    start_at_ms: int = 0  # no occurrence before it
    end_at_ms: int = 0  # no occurrence after it
    max_runs: int = 0  # the job completes after this many runs started
    start_deadline_ms: int = 0  # a one-off job not started by runAt + this is dead-lettered
    pause_after: int = 0  # consecutive dead-lettered occurrences that pause the job

    @property
    def bounds_time(self) -> bool:
        return bool(self.start_at_ms or self.end_at_ms)


NO_LIFE = Life()


def life_of(raw: Any) -> Life:
    """The spec's ``life`` element (None or life_packed's text) as a Life."""
    return Life(*map(int, raw[1:].split(","))) if raw else NO_LIFE


def life_packed(life: Life) -> str | None:
    """What pack_spec stores: None (left out) for no limits, else 'L' and the five integers
    joined by ',' (a spec with limits ends with them: models.SPEC_WITH_LIFE)."""
    if life is NO_LIFE or life == NO_LIFE:  # `is` first: every job without limits is NO_LIFE
        return None
    return "L" + ",".join(map(str, life))


def bounded(next_after: Callable[[int], int], life: Life) -> Callable[[int], int]:
    """``next_after`` kept inside [startAt, endAt]: NEVER_MS once no occurrence is left."""
    if not life.bounds_time:
        return next_after
    start, end = life.start_at_ms, life.end_at_ms

    def next_in_window(after_ms: int) -> int:
        if after_ms >= NEVER_MS:
            return NEVER_MS
        at = next_after(max(after_ms, start - 1) if start else after_ms)
        return NEVER_MS if end and at > end else at

    return next_in_window


def skip_reason(at_ms: int, kept_before: int, life: Life, runs_taken: int) -> str | None:
    """Why the job's policies would not run its occurrence at ``at_ms``, after ``kept_before``
    later ones that would run (the preview's marks); None: it would run."""
    if life.start_at_ms and at_ms < life.start_at_ms:
        return "beforeStartAt"
    if life.end_at_ms and at_ms > life.end_at_ms:
        return "afterEndAt"
    if life.max_runs and kept_before >= life.max_runs - runs_taken:
        return "beyondMaxRuns"
    return None
