"""Claimer: one batch of due occurrences and retries per owned partition, two round trips.

1. candidates: the earliest due jobs and retries of every owned partition (one pipeline);
2. one claim script per partition (one pipeline), which re-checks everything atomically against
   Redis's clock and the caller's fencing token.  One-off jobs and retries need nothing more:
   the script reads them and picks their queue stream.  Recurring jobs come back from the first
   call (their next time is computed here, in Python), then go through a second pair of round
   trips: read their schedule fields, claim with the computed times.  The claimer remembers
   which job ids are recurring, so later rounds send them the second way at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import keys, scripts
from ..cron import parse_cron
from ..ids import run_id as make_run_id
from ..models import unpack_spec
from ..spec import due_score, jitter_offset_ms

log = logging.getLogger("rsched.dispatcher")

JOB_FIELDS = ("status", "next_ms", "queue", "cron", "spec")
CLAIMS_IN_FLIGHT = 2  # claim scripts queued in Redis at once
CRON_CACHE = 100_000  # recurring job ids remembered (a miss costs one extra claim call)


@dataclass
class ClaimResult:
    dispatched: int = 0
    skipped: int = 0
    earliest_ms: int | None = None  # earliest due time left in the owned partitions
    full: bool = False  # some partition had a full batch: call again at once
    lost: tuple[int, ...] = ()  # partitions whose fence was stale
    now_ms: int | None = None  # the clock the round was judged by
    left: list[float] = field(default_factory=list)  # earliest scores the scripts saw left


@dataclass
class Claimer:
    r: Any  # redis.asyncio.Redis
    owner: str
    batch: int = 250
    misfire_grace_ms: int = 60_000
    events_maxlen: int = 0
    clock: Callable[[], int] | None = None  # injected ms clock (tests); None = Redis TIME
    catchup_ms: int = 1000  # lateness tolerated before missed occurrences collapse into one

    _offset_ms: int = 0  # Redis clock minus local clock, from the last round's TIME
    _queues: dict[int, list[str]] = field(default_factory=dict)  # each partition's queues
    _cron: set[str] = field(default_factory=set)  # job ids known to be recurring

    def _estimate_now(self) -> int:
        return int(time.time() * 1000) + self._offset_ms

    async def run_once(self, owned: dict[int, int]) -> ClaimResult:
        out = ClaimResult()
        if not owned:
            return out
        parts = sorted(owned)
        # Only entries due by (estimated Redis time + margin) come back, plus each set's head for
        # the sleep computation: a round costs O(due), not O(batch), when little is due.
        horizon = (self.clock() if self.clock else self._estimate_now()) + 20
        pipe = self.r.pipeline(transaction=False)
        pipe.time()
        for p in parts:
            for key in (keys.due(p), keys.retry(p)):
                pipe.zrangebyscore(key, "-inf", horizon, start=0, num=self.batch, withscores=True)
                pipe.zrange(key, 0, 0, withscores=True)
            if p not in self._queues:
                pipe.smembers(keys.queues(p))
        res = await pipe.execute()
        sec, usec = res[0]
        redis_now = int(sec) * 1000 + int(usec) // 1000
        self._offset_ms = redis_now - int(time.time() * 1000)
        now = self.clock() if self.clock else redis_now
        out.now_ms = now
        # A due score is the due ms minus priority/2048: due once it is <= now + 0.5.
        cutoff = now + 0.5
        earliest: float | None = None
        plain: dict[int, list[list[Any]]] = {}  # claimable as read: retries
        once: dict[int, list[tuple[str, float]]] = {}  # claimable as read: one-off jobs
        recurring: dict[int, list[tuple[str, float]]] = {}  # need their next time first
        i = 1
        for p in parts:
            due, due_head, ret, ret_head = res[i : i + 4]
            i += 4
            if p not in self._queues:
                self._queues[p] = sorted(q.decode() for q in res[i])
                i += 1
            for got, head in ((due, due_head), (ret, ret_head)):
                if len(got) >= self.batch:
                    out.full = True
                later = [sc for _, sc in got if sc > cutoff] + [sc for _, sc in head if sc > cutoff]
                if later:
                    earliest = min(later) if earliest is None else min(earliest, *later)
            ones: list[tuple[str, float]] = []
            cron = self._cron
            for m, sc in due:
                if sc > cutoff:
                    break
                job_id = m.decode()
                if job_id in cron:
                    recurring.setdefault(p, []).append((job_id, sc))
                else:
                    ones.append((job_id, sc))
            if ones:
                once[p] = ones
            items: list[list[Any]] = []
            for m, sc in ret:
                if sc > now:
                    break
                rid = m.decode()
                items.append(["r", rid.rsplit("@", 1)[0], rid, sc, 0, 0, 0, 1])
            if items:
                plain[p] = items
        if not plain and not once and not recurring:
            out.earliest_ms = None if earliest is None else int(round(earliest))
            return out

        now_arg = now if self.clock else 0
        if plain or once:
            needs = await self._claim(plain, owned, now_arg, out, once)
            for p, ids in needs.items():
                recurring.setdefault(p, []).extend(ids)
        if recurring:
            await self._claim_recurring(recurring, owned, now, now_arg, out)
        for e in out.left:
            earliest = e if earliest is None else min(earliest, e)
        out.earliest_ms = None if earliest is None else int(round(earliest))
        return out

    async def _claim(self, calls_by_part: dict[int, list[list[Any]]], owned: dict[int, int],
                     now_arg: int, out: ClaimResult,
                     once: dict[int, list[tuple[str, float]]] | None = None,
                     ) -> dict[int, list[tuple[str, float]]]:
        """One claim script per partition; returns the job ids handed back, with their scores.

        The calls go out as soon as their arguments are built, CLAIMS_IN_FLIGHT at a time:
        Redis runs one partition's script while Python builds the next, and workers' reads and
        reports get their turn between two scripts instead of waiting behind all of them."""
        once = once or {}
        parts = sorted({*calls_by_part, *once})
        slots = asyncio.Semaphore(CLAIMS_IN_FLIGHT)

        async def claim(p: int) -> Any:
            call = self._claim_call(p, owned[p], now_arg, calls_by_part.get(p, []),
                                    once.get(p, []))
            async with slots:
                return (await scripts.acall_many(self.r, [call]))[0]

        results = await asyncio.gather(*(claim(p) for p in parts))
        needs: dict[int, list[tuple[str, float]]] = {}
        lost = list(out.lost)
        for p, res in zip(parts, results, strict=True):
            if isinstance(res, Exception):
                log.error("claim on partition %d failed: %s", p, res)
                continue
            if int(res[0]) == -1:
                lost.append(p)
                continue
            out.dispatched += int(res[0])
            out.skipped += int(res[1])
            if res[2] not in (b"", ""):
                out.left.append(float(res[2]))
            if len(res) > 3:
                handed = {_s(x) for x in res[3:]}
                for job_id, score in once.get(p, []):
                    if job_id in handed:
                        needs.setdefault(p, []).append((job_id, score))
                for it in calls_by_part.get(p, []):
                    if it[0] == "r" and it[2] in handed:
                        # A retry on a queue this claimer did not know: reload the partition's
                        # queues and go again at once.
                        self._queues.pop(p, None)
                        out.full = True
                    elif it[1] in handed:
                        needs.setdefault(p, []).append((it[1], it[3]))
        out.lost = tuple(lost)
        return needs

    async def _claim_recurring(self, cands: dict[int, list[tuple[str, float]]],
                               owned: dict[int, int], now: int, now_arg: int,
                               out: ClaimResult) -> None:
        """Read recurring jobs' schedules, compute their next times, claim them."""
        pipe = self.r.pipeline(transaction=False)
        for p, due in cands.items():
            for job_id, _ in due:
                pipe.hmget(keys.job(p, job_id), JOB_FIELDS)
        fields = iter(await pipe.execute())
        stale: list[tuple[str, str]] = []  # index entries whose hash is gone
        items_by_part: dict[int, list[list[Any]]] = {}
        for p, due in cands.items():
            items = []
            for job_id, score in due:
                f = next(fields)
                if f[0] is None:  # job hash gone (deleted out of band): drop its index entry
                    stale.append((keys.due(p), job_id))
                    continue
                items.append(self._job_item(p, job_id, score, f, now))
            if items:
                items_by_part[p] = items
        if stale:
            # Without this a stale head would look due forever and the loop would never sleep.
            pipe = self.r.pipeline(transaction=False)
            for key, member in stale:
                pipe.zrem(key, member)
            await pipe.execute()
            log.warning("dropped %d index entries whose job or run hash is gone", len(stale))
        if items_by_part:
            needs = await self._claim(items_by_part, owned, now_arg, out)
            for p, ids in needs.items():
                log.error("partition %d: jobs %s handed back twice (queue %s?)", p,
                          [j for j, _ in ids][:5], self._queues.get(p))

    def _job_item(self, p: int, job_id: str, score: float, f: list[Any], now: int) -> list[Any]:
        next_ms, queue, cron = (v.decode() if v is not None else "" for v in f[1:4])
        if queue not in self._queues.setdefault(p, []):
            self._queues[p] = sorted({*self._queues[p], queue})
        expected = int(next_ms or 0)
        nxt: int = 0
        nxt_score: float | int = 0
        fire = 1
        if cron:
            if len(self._cron) >= CRON_CACHE:
                self._cron.clear()
            self._cron.add(job_id)
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
            self._cron.discard(job_id)
        return ["j", job_id, make_run_id(job_id, expected), score, next_ms or "0", nxt, nxt_score,
                fire]

    def _claim_call(self, p: int, fence: int, now: int, items: list[list[Any]],
                    once: Sequence[tuple[str, float]] = ()) -> scripts.Call:
        queues = self._queues.get(p) or []
        ks = [keys.lease(p), keys.due(p), keys.retry(p), keys.events(p), keys.stats(p)]
        ks += [keys.stream(p, q) for q in queues]
        args: list[Any] = [self.owner, fence, now, self.events_maxlen, len(queues), len(items),
                           keys.GROUP, len(once)]
        # One-off jobs: a key and two values each (see lua/claim.lua), built without a call.
        prefix = keys.job(p, "")
        for job_id, score in once:
            ks.append(prefix + job_id)
            args += (job_id, score)
        for it in items:
            ks += [keys.job(p, it[1]), keys.run(p, it[2])]
            args += it
        return ("claim", ks, args)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
