"""ReadAlong: the hand-off by which a report carries the fetch loop's next read, so the two
share one round trip.

While a worker's table of runs is (nearly) full its fetch loop waits for slots instead of
reading; the next report frees slots, and the read for them goes with the report's script
calls (rdb.scripts.acall_many_then) instead of in a round trip of its own, which saves about a
tenth of a run's worker CPU at concurrency 16 (loadtest/bench_phases.py).  Who calls what:

* Worker.run `open`s it, with the intake as the reader, only where a read and a report can
  share a round trip: one fetch loop reading every stream, on one pooled Redis, with the stock
  script sender (an injected sender sees script calls alone); it `close`s it when the fetch
  loops end.  While it is open every report goes raw (`is_open`), read or not.
* Worker._fetch_loop, while it waits for slots: ``with read_along.waiting(stop):``.  A report
  reads only meanwhile, one read at a time (two reports cannot both fill the slots), and never
  once ``stop`` is set (a draining worker takes no new runs).
* Reporter.flush_once: `plan` before it sends (the read's commands, or None), then `took`
  once the report's runs left the table (None: the read did not go, or failed), which has the
  reader start what it got.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Reader(Protocol):
    """What plans and starts a read that goes along (rsched.engine.worker.intake.Intake)."""

    def plan_with_report(self, freed: int) -> Any:
        """The read for the slots free once ``freed`` more are (None: none would be)."""

    def read_commands(self, plan: Any) -> list[tuple[Any, ...]]:
        """The planned read as raw commands (non-blocking)."""

    def took_with_report(self, plan: Any, replies: list[Any] | None) -> int:
        """Start what the read got (None: nothing); returns how many runs started."""


class ReadAlong:
    """See the module's docstring."""

    __slots__ = ("_pending", "_reader", "_waiting")

    def __init__(self) -> None:
        self._reader: Reader | None = None
        self._waiting: asyncio.Event | None = None  # the fetch loop's stop while it waits
        self._pending: tuple[Reader, Any] | None = None  # a read planned, not yet taken

    @property
    def is_open(self) -> bool:
        """Reads may go with reports (and reports go raw)."""
        return self._reader is not None

    def open(self, reader: Reader) -> None:
        self._reader = reader

    def close(self) -> None:
        self._reader = None

    def waiting(self, stop: asyncio.Event) -> ReadAlong:
        """For ``with``: the fetch loop waits for slots until ``stop``; a report may read for
        it meanwhile."""
        self._waiting = stop
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._waiting = None

    def plan(self, freed: int) -> list[tuple[Any, ...]] | None:
        """The read a report freeing ``freed`` slots takes along: its commands, or None
        (closed, the fetch loop not waiting or stopped, a read already under way, or no slot
        free even then)."""
        reader, stop = self._reader, self._waiting
        if reader is None or stop is None or stop.is_set() or self._pending is not None:
            return None
        plan = reader.plan_with_report(freed)
        if plan is None:
            return None
        self._pending = (reader, plan)
        return reader.read_commands(plan)

    def took(self, replies: list[Any] | None) -> int:
        """The planned read's replies (None: it did not go, or failed): its reader starts what
        it got; returns how many runs started."""
        if self._pending is None:
            return 0
        (reader, plan), self._pending = self._pending, None
        return reader.took_with_report(plan, replies)
