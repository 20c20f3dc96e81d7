"""Recurring jobs in a claim round (rsched.engine.dispatcher.claimer): which job ids are
recurring, and their claim items, with the next time computed here in Python from the job's
schedule fields (cron, zone, jitter, misfire, catch-up window) by rsched.core.catchup, kept
inside the job's startAt and endAt (rsched.core.lifecycle; next 0 once none is left).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rsched.core import defaults
from rsched.core.catchup import plan_catch_up
from rsched.core.cron import parse_cron
from rsched.core.ids import run_id as make_run_id
from rsched.core.lifecycle import NEVER_MS, bounded, life_of
from rsched.core.models import gap_text, unpack_spec
from rsched.core.spec import due_score, jitter_offset_ms
from rsched.core.wire import CLAIM_JOB, ClaimItem
from rsched.rdb.due_reads import drop_due, read_schedules

log = logging.getLogger("rsched.dispatcher")

CRON_CACHE = 100_000  # recurring job ids remembered (a miss costs one extra claim call)

# The claim item's fire value for an occurrence that runs, by the job's stored overlap policy
# ('' = allow): lua/claim.lua decides skip and bufferOne against the job's active run.
_FIRE: dict[str, int | str] = {"skip": "s", "bufferOne": "b", "cancelPrevious": "c"}
_OVERLAP_FIRES = frozenset("sbc")

# Per partition: due job ids with their scores (None: read without, see Claimer._read_due).
Due = dict[int, list[tuple[str, float | None]]]


@dataclass
class RecurringJobs:
    ids: set[str] = field(default_factory=set)  # job ids known to be recurring

    async def items(self, r: Any, cands: Due, clocks: dict[int, int],
                    queues: dict[int, list[str]]
                    ) -> tuple[dict[int, list[ClaimItem]], dict[int, list[str]]]:
        """Read the candidates' schedules (one pipeline: rdb.due_reads.read_schedules) and
        build their claim items, each partition's by its own node's clock (``clocks``, ms),
        with the active runs of those under an overlap policy (lua/claim.lua judges whether
        they ended); drops the index entries of jobs whose hash is gone.  ``queues`` learns
        the jobs' queues."""
        read = iter(await read_schedules(r, cands))
        stale: list[tuple[int, str]] = []  # index entries whose hash is gone
        items_by_part: dict[int, list[ClaimItem]] = {}
        actives: dict[int, list[str]] = {}
        for p, due in cands.items():
            items = []
            for job_id, _ in due:
                f, score = next(read)
                if f[0] is None:  # job hash gone (deleted out of band): drop its index entry
                    stale.append((p, job_id))
                    continue
                if score is None:  # no longer in the due set (claimed or removed meanwhile)
                    continue
                it = self.item(p, job_id, score, f, clocks[p], queues)
                items.append(it)
                if f[5] and isinstance(it.fire, str) and it.fire[0] in _OVERLAP_FIRES:
                    actives.setdefault(p, []).append(f[5].decode())
            if items:
                items_by_part[p] = items
        if stale:
            # Without this a stale head would look due forever and the loop would never sleep.
            await drop_due(r, stale)
            log.warning("dropped %d index entries whose job or run hash is gone", len(stale))
        return items_by_part, actives

    def item(self, p: int, job_id: str, score: float, f: list[Any], now: int,
             queues: dict[int, list[str]]) -> ClaimItem:
        """The claim item of a due job read as rdb.due_reads.JOB_FIELDS ``f``; notes whether
        it recurs."""
        next_ms, queue, cron = (v.decode() if v is not None else "" for v in f[1:4])
        queue = queue or defaults.QUEUE  # not stored at its default (core.layout)
        if queue not in queues.setdefault(p, []):
            queues[p] = sorted({*queues[p], queue})
        expected = run_ms = int(next_ms or 0)
        nxt: int = 0
        nxt_score: float | int = 0
        fire: int | str = 1
        if cron:
            if len(self.ids) >= CRON_CACHE:
                self.ids.clear()
            self.ids.add(job_id)
            sp = unpack_spec(f[4])
            sched = parse_cron(cron, sp.get("tz") or "UTC")
            # Inside the window the occurrence runs and the schedule steps to the next nominal
            # time (due already after an outage: the next round runs it); older ones are a gap.
            plan = plan_catch_up(bounded(sched.next_after, life_of(sp.get("life"))), expected, now,
                                 sp.get("catch_up_ms", defaults.CATCH_UP_WINDOW_MS),
                                 sp.get("misfire") != "skip")
            nxt = plan.next_ms if plan.next_ms < NEVER_MS else 0
            if nxt:
                jit = jitter_offset_ms(job_id, nxt, int(sp.get("jitter_ms") or 0))
                nxt_score = due_score(nxt + jit, int(sp.get("priority") or 0))
            if plan.run_ms is None:
                fire = 0
            else:
                run_ms = plan.run_ms
                fire = _FIRE.get(sp.get("overlap") or "", 1)
            if plan.gap is not None:
                fire = f"{fire} {gap_text(plan.gap)}"
        else:
            self.ids.discard(job_id)
        return ClaimItem(CLAIM_JOB, job_id, make_run_id(job_id, run_ms), score, next_ms or "0",
                         nxt, nxt_score, fire)
