"""Taking runs: fresh entries from every stream (one XREADGROUP), the entries of workers that
missed their heartbeats (take_over) and entries idle past the visibility timeout (XAUTOCLAIM),
up to the free slots."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rsched.core import defaults
from rsched.core.wire import ENTRY_ATTEMPT, ENTRY_DUE, ENTRY_RUN, ENTRY_TYPE, as_text
from rsched.engine.worker._link import Link
from rsched.engine.worker.handback import Handback
from rsched.engine.worker.inflight import STARTED, Inflight, Runs, inflight
from rsched.engine.worker.reporter import Reporter
from rsched.engine.worker.runner import Runner
from rsched.obs.metrics import RunMetrics
from rsched.rdb import worker_streams
from rsched.rdb.redis_api import RedisConnectionError, RedisTimeoutError
from rsched.rdb.worker_streams import Entry, raw_entries

log = logging.getLogger("rsched.worker")


class ReadPlan(NamedTuple):
    """One XREADGROUP: its streams, COUNT, and whether it is focused (see Intake._plan); a
    focused read may go with a probe, a second XREADGROUP of one entry from each stream not
    known to be busy."""

    streams: list[str]
    n: int  # COUNT
    focused: bool
    probe: tuple[str, ...] = ()


@dataclass(slots=True)
class Intake:
    """Reads entries and hands them to the runner: fresh ones at once (their start is recorded
    later, see the reporter), reclaimed ones once they are started (and fenced)."""

    link: Link
    runs: Runs
    runner: Runner
    reporter: Reporter
    metrics: RunMetrics
    visibility_ms: int
    handback: Handback  # runs of types without a handler here go there, never to the runner
    served: frozenset[bytes]  # the job types this worker has handlers for, as entries hold them
    _cursors: dict[str, str] = field(default_factory=dict)  # XAUTOCLAIM's cursor per stream
    _busy: list[str] = field(default_factory=list)  # streams the last full read found entries in
    _turn: int = 0  # where the next focused read starts among them
    _full_at: float = 0.0  # monotonic time of the last read of every stream

    async def fetch_once(self, block_ms: int = 1000, streams: Sequence[str] | None = None) -> int:
        """Read new entries from every stream, or from ``streams`` (a cluster's one XREADGROUP
        covers one slot: the worker then runs a fetch loop per partition), up to free capacity,
        and start them."""
        free = self.runs.free()
        if free <= 0:
            return 0
        names = list(self.link.streams if streams is None else streams)
        plan = self._plan(names, free)
        if plan.focused:
            focused = await self._take(plan)
            if focused:
                return self._launch(focused)
            plan = self._plan(names, free, full=True)
        return self._launch(await self._take(plan, block_ms))

    async def _take(self, plan: ReadPlan, block_ms: int | None = None) -> list[Entry]:
        """A planned read's entries (rdb.worker_streams.read_new: raw on one pooled
        connection, as a report's read, or through redis-py)."""
        return self._took(plan, await worker_streams.read_new(
            self.link.r, self.link.id, plan.streams, plan.n, block_ms, plan.probe,
            self.link.held))

    def _plan(self, names: list[str], free: int, full: bool = False) -> ReadPlan:
        """The next read for ``free`` slots.  COUNT applies per stream: a read of every stream
        splits the free slots over all streams (not just this read's), and a probe takes one
        entry a stream, so neither overshoots the concurrency by more than one entry per
        stream (Runner._wait_turn holds those until a slot is free).

        With few free slots for many streams, one entry a stream a read would leave every
        report one run per partition (one complete call per run).  Instead a focused read takes
        FOCUS_COUNT or more entries from a few streams, in turn from those known to be busy (a
        full read or a probe found entries there, and no read since came back short of its
        COUNT); nothing there (no block): the caller reads every stream as before.  At least
        every FOCUS_S a probe goes with the focused read in its round trip, one entry from each
        stream not known to be busy, so a stream that became busy since waits no longer than
        that.  Focused reads are what keeps a complete call carrying many runs: a call costs
        Redis more than a run does (loadtest/script_instructions.py), and FOCUS_COUNT is sized so
        one read fills the slots of one stream at concurrency 16 and three at 100 (figures:
        loadtest/bench_phases.py, docs/performance.md).  The probe takes one entry
        from each stream not known to be busy, where a full read took one from every stream,
        busy ones included, and split the reports into one-run calls."""
        count = max(1, free // len(self.link.streams))
        among = set(names)
        known = [s for s in self._busy if s in among]
        check = time.monotonic() - self._full_at >= defaults.FOCUS_S
        if full or count >= defaults.FOCUS_COUNT or len(names) < 2 or (check and not known):
            self._full_at = time.monotonic()
            return ReadPlan(names, count, False)
        busy = known or names
        k = max(1, min(len(busy), free // defaults.FOCUS_COUNT))
        self._turn = (self._turn + 1) % len(busy)
        probe: tuple[str, ...] = ()
        if check:
            self._full_at = time.monotonic()
            seen = set(known)
            probe = tuple(s for s in names if s not in seen)
        return ReadPlan([busy[(self._turn + j) % len(busy)] for j in range(k)], free // k, True,
                        probe)

    def _took(self, plan: ReadPlan, reads: list[list[Entry]]) -> list[Entry]:
        """A planned read's entries, its probe's after them (``reads``: the entries of each
        read); notes which streams are busy: after a full read those it found entries in;
        after a focused one those still known busy, less those it came back short from
        (drained), and those the probe found entries in."""
        entries = reads[0]
        probed = reads[1] if len(reads) > 1 else []
        if not plan.focused:
            got = {s for s, _, _ in entries}
            self._busy = [s for s in plan.streams if s in got]
        elif not entries and not probed:
            self._busy = []
        else:
            taken: dict[str, int] = defaultdict(int)
            for s, _, _ in entries:
                taken[s] += 1
            short = {s for s in plan.streams if taken[s] < plan.n}
            found = {s for s, _, _ in probed}
            self._busy = [s for s in self._busy if s not in short] + [
                s for s in plan.probe if s in found]
        return entries + probed

    # --- reads that go with a report (the Reader of read_along.ReadAlong) ------------------

    def plan_with_report(self, freed: int) -> ReadPlan | None:
        """The read a report freeing ``freed`` slots takes along while the fetch loop waits
        (None: no slot free even then)."""
        free = self.runs.free(freed)
        if free <= 0:
            return None
        return self._plan(list(self.link.streams), free)

    def read_commands(self, plan: ReadPlan) -> list[tuple[Any, ...]]:
        """The planned XREADGROUP (and its probe's), non-blocking, as raw commands."""
        return worker_streams.read_commands(self.link.id, plan.streams, plan.n, None,
                                            plan.probe)

    def took_with_report(self, plan: ReadPlan, resps: list[Any] | None) -> int:
        """Start what the report's reads got (None or an error: nothing, the fetch loop
        reads)."""
        if not resps or any(isinstance(resp, Exception) for resp in resps):
            return 0
        return self._launch(self._took(plan, [raw_entries(resp) for resp in resps]))

    def _launch(self, entries: list[Entry]) -> int:
        """Run fresh entries at once; their start is recorded later (see the reporter).  Those
        of types without a handler here are set aside for a worker that has one (handback)."""
        now_s, now, lag = time.time(), time.perf_counter(), self.metrics.lag
        streams, by_id, run = self.link.streams, self.runs.by_id, self.runner.run
        started: dict[tuple[str, str], int] = defaultdict(int)
        started_in, served = self.metrics.started_in, self.served
        foreign: list[Entry] = []
        for s, eid, f in entries:
            if f[ENTRY_TYPE] not in served:
                foreign.append((s, eid, f))
                continue
            p, queue = streams[s]
            rid = f[ENTRY_RUN].decode()
            if rid in by_id:  # delivered again while still running here
                continue
            attempt = int(f.get(ENTRY_ATTEMPT, 1))  # left out for a first attempt (wire)
            fl = inflight(p, s, queue, eid, rid, f, attempt, now)
            started[(fl.type, queue)] += 1
            started_in[p] += 1
            if attempt == 1:  # retries wait for their backoff on purpose
                due = f.get(ENTRY_DUE)  # meant to start later than scheduled (a backfill, ...)
                lag.observe(queue, now_s - (fl.sched_ms if due is None else float(due)) / 1000)
            run(fl, f)
        for (jtype, queue), n in started.items():
            self.metrics.count("started", jtype, queue, n)
        if foreign:
            self.handback.later(foreign)
        return len(entries) - len(foreign)

    async def reclaim_once(self) -> int:
        """Take over entries idle longer than the visibility timeout (their worker is gone)."""
        free = self.runs.free()
        if free <= 0:
            return 0
        entries: list[Entry] = []
        for s, cursor, got in await worker_streams.reclaim(
                self.link.r, self.link.id, list(self.link.streams), self._cursors,
                self.visibility_ms, free):
            self._cursors[s] = cursor
            entries += got
        entries = await self._ours(entries)
        if entries:
            log.info("reclaiming %d idle runs", len(entries))
        return await self._start_reclaimed(entries)

    async def take_over(self, dead: str, min_idle_ms: int) -> tuple[int, bool]:
        """Take over the runs of worker ``dead`` (it missed its heartbeats, or left with runs
        pending), up to the free slots: (how many started here, whether none is left under its
        name).  Each is started like a reclaimed run: under a new fence, its lost attempt
        counted."""
        free = self.runs.free()
        if free <= 0:
            return 0, False
        r = self.link.r
        counts = await worker_streams.pending_counts(r, list(self.link.streams), dead)
        whole = -1 not in counts.values()
        calls, streams = [], []
        for s, n in counts.items():
            if n > 0 and free > 0:
                calls.append(worker_streams.take_over(s, dead, self.link.id, min_idle_ms,
                                                      min(n, free)))
                streams.append(s)
                whole, free = whole and n <= free, free - min(n, free)
            elif n > 0:
                whole = False
        entries: list[Entry] = []
        for s, res in zip(streams, await self.link.call_many(r, calls), strict=True):
            if isinstance(res, Exception):
                log.warning("taking over the runs of worker %s on %s: %s", dead, s, res)
                whole = False
                continue
            got, left = worker_streams.taken(s, res)
            entries += got
            whole = whole and not left
        entries = await self._ours(entries)
        if entries:
            whose = ("an earlier process under this worker's id" if dead == self.link.id
                     else f"worker {dead}, which missed its heartbeats or died,")
            log.warning("taking over %d runs of %s", len(entries), whose)
        return await self._start_reclaimed(entries), whole

    async def _ours(self, entries: list[Entry]) -> list[Entry]:
        """Of entries taken over, those to start here: not already running here, and of a type
        with a handler here (the others are set aside for a worker that has it)."""
        entries = [e for e in entries if as_text(e[2][ENTRY_RUN]) not in self.runs]
        foreign = [e for e in entries if e[2][ENTRY_TYPE] not in self.served]
        if foreign:
            entries = [e for e in entries if e[2][ENTRY_TYPE] in self.served]
            await self.handback.park(foreign)
        return entries

    async def adopt_once(self) -> int:
        """Start runs of our types that workers without their handler set aside."""
        free = self.runs.free()
        if free <= 0:
            return 0
        try:
            found = await self.handback.find(free)
        except (RedisConnectionError, RedisTimeoutError):
            return 0  # Redis is away: the fetch loop says so, not this loop four times a second
        entries = [e for e in found if as_text(e[2][ENTRY_RUN]) not in self.runs]
        if entries:
            log.info("taking %d runs set aside by workers without their handler", len(entries))
        return await self._start_reclaimed(entries, adopted=True)

    async def _start_reclaimed(self, entries: list[Entry], adopted: bool = False) -> int:
        """Reclaimed (or adopted) entries: take a new fencing token first, then run."""
        if not entries:
            return 0
        now = time.perf_counter()
        fls: list[Inflight] = []
        for s, eid, f in entries:
            p, queue = self.link.streams[s]
            fls.append(inflight(p, s, queue, eid, as_text(f[ENTRY_RUN]), f, 0, now))
        await self.reporter.record_starts(fls, reclaimed=not adopted, adopted=adopted)
        started = 0
        for fl, (_, _, f) in zip(fls, entries, strict=True):
            if fl.phase is STARTED and fl.run_id not in self.runs:
                self.metrics.count("started", fl.type, fl.queue)
                if not adopted:
                    self.metrics.count("reclaimed", fl.type, fl.queue)
                elif fl.attempt == 1:  # its wait to be set aside and taken counts as start lag
                    self.metrics.lag.observe(fl.queue, time.time() - fl.sched_ms / 1000)
                self.metrics.started_in[fl.partition] += 1
                self.runner.run(fl, f)
                started += 1
        return started
