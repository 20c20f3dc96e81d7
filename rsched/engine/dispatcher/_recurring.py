"""Recurring jobs in a claim round (rsched.engine.dispatcher.claimer): which job ids are
recurring, and their claim items, with the next time computed here in Python from the job's
schedule fields (cron, zone, jitter, misfire) and the catch-up rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rsched.core.cron import parse_cron
from rsched.core.ids import run_id as make_run_id
from rsched.core.models import unpack_spec
from rsched.core.spec import due_score, jitter_offset_ms
from rsched.core.wire import CLAIM_JOB, ClaimItem
from rsched.rdb import keys

log = logging.getLogger("rsched.dispatcher")

JOB_FIELDS = ("status", "next_ms", "queue", "cron", "spec")
CRON_CACHE = 100_000  # recurring job ids remembered (a miss costs one extra claim call)

Due = dict[int, list[tuple[str, float]]]  # per partition: due job ids with their scores


@dataclass
class RecurringJobs:
    misfire_grace_ms: int
    catchup_ms: int  # lateness before missed occurrences collapse into one
    ids: set[str] = field(default_factory=set)  # job ids known to be recurring

    async def items(self, r: Any, cands: Due, now: int,
                    queues: dict[int, list[str]]) -> dict[int, list[ClaimItem]]:
        """Read the candidates' schedules (one pipeline) and build their claim items; drops the
        index entries of jobs whose hash is gone.  ``queues`` learns the jobs' queues."""
        pipe = r.pipeline(transaction=False)
        for p, due in cands.items():
            for job_id, _ in due:
                pipe.hmget(keys.job(p, job_id), JOB_FIELDS)
        fields = iter(await pipe.execute())
        stale: list[tuple[str, str]] = []  # index entries whose hash is gone
        items_by_part: dict[int, list[ClaimItem]] = {}
        for p, due in cands.items():
            items = []
            for job_id, score in due:
                f = next(fields)
                if f[0] is None:  # job hash gone (deleted out of band): drop its index entry
                    stale.append((keys.due(p), job_id))
                    continue
                items.append(self.item(p, job_id, score, f, now, queues))
            if items:
                items_by_part[p] = items
        if stale:
            # Without this a stale head would look due forever and the loop would never sleep.
            pipe = r.pipeline(transaction=False)
            for key, member in stale:
                pipe.zrem(key, member)
            await pipe.execute()
            log.warning("dropped %d index entries whose job or run hash is gone", len(stale))
        return items_by_part

    def item(self, p: int, job_id: str, score: float, f: list[Any], now: int,
             queues: dict[int, list[str]]) -> ClaimItem:
        """The claim item of a due job read as JOB_FIELDS ``f``; notes whether it recurs."""
        next_ms, queue, cron = (v.decode() if v is not None else "" for v in f[1:4])
        if queue not in queues.setdefault(p, []):
            queues[p] = sorted({*queues[p], queue})
        expected = int(next_ms or 0)
        nxt: int = 0
        nxt_score: float | int = 0
        fire = 1
        if cron:
            if len(self.ids) >= CRON_CACHE:
                self.ids.clear()
            self.ids.add(job_id)
            sp = unpack_spec(f[4])
            sched = parse_cron(cron, sp.get("tz") or "UTC")
            nxt = sched.next_after(expected)
            if nxt <= now - self.catchup_ms:
                # Missed more than one occurrence (downtime): run the missed one once, then resume
                # from now, instead of a catch-up storm.  Mere lag below catchup_ms loses nothing.
                nxt = sched.next_after(now)
            jit = jitter_offset_ms(job_id, nxt, int(sp.get("jitter_ms") or 0))
            nxt_score = due_score(nxt + jit, int(sp.get("priority") or 0))
            if sp.get("misfire") == "skip" and now - expected > self.misfire_grace_ms:
                fire = 0
        else:
            self.ids.discard(job_id)
        return ClaimItem(CLAIM_JOB, job_id, make_run_id(job_id, expected), score, next_ms or "0",
                         nxt, nxt_score, fire)
