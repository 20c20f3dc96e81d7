"""Claimer: one batch of due occurrences and retries per owned partition, three round trips total.

1. candidates: the earliest due jobs and retries of every owned partition (one pipeline);
2. their schedule fields (one pipeline), so Python can compute each recurring job's next time;
3. one claim script per partition (one pipeline), which re-checks everything atomically against
   Redis's clock and the caller's fencing token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import keys, scripts
from ..cron import parse_cron
from ..ids import run_id as make_run_id
from ..models import unpack_spec
from ..spec import jitter_offset_ms

log = logging.getLogger("rsched.dispatcher")

JOB_FIELDS = ("status", "next_ms", "queue", "cron", "spec")


@dataclass
class ClaimResult:
    dispatched: int = 0
    skipped: int = 0
    earliest_ms: int | None = None  # earliest due time left in the owned partitions
    full: bool = False  # some partition had a full batch: call again at once
    lost: tuple[int, ...] = ()  # partitions whose fence was stale
    now_ms: int | None = None  # the clock the round was judged by


@dataclass
class Claimer:
    r: Any  # redis.asyncio.Redis
    owner: str
    batch: int = 1000
    misfire_grace_ms: int = 60_000
    events_maxlen: int = 0
    clock: Callable[[], int] | None = None  # injected ms clock (tests); None = Redis TIME
    catchup_ms: int = 1000  # lateness tolerated before missed occurrences collapse into one

    _offset_ms: int = 0  # Redis clock minus local clock, from the last round's TIME

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
        res = await pipe.execute()
        sec, usec = res[0]
        redis_now = int(sec) * 1000 + int(usec) // 1000
        self._offset_ms = redis_now - int(time.time() * 1000)
        now = self.clock() if self.clock else redis_now
        out.now_ms = now
        cands: dict[int, tuple[list[tuple[str, float]], list[tuple[str, float]]]] = {}
        earliest: float | None = None
        for i, p in enumerate(parts):
            lists = []
            for k in range(2):
                got, head = res[1 + 4 * i + 2 * k], res[2 + 4 * i + 2 * k]
                ready = [(m.decode(), sc) for m, sc in got if sc <= now]
                later = [sc for _, sc in got[len(ready):]] + [sc for _, sc in head if sc > now]
                if len(got) >= self.batch:
                    out.full = True
                if later:
                    earliest = min(later) if earliest is None else min(earliest, *later)
                lists.append(ready)
            if lists[0] or lists[1]:
                cands[p] = (lists[0], lists[1])
        if not cands:
            out.earliest_ms = None if earliest is None else int(earliest)
            return out

        pipe = self.r.pipeline(transaction=False)
        for p, (due, ret) in cands.items():
            for job_id, _ in due:
                pipe.hmget(keys.job(p, job_id), JOB_FIELDS)
            for rid, _ in ret:
                pipe.hmget(keys.run(p, rid), ("state", "attempt", "queue"))
        fields = iter(await pipe.execute())

        calls: list[scripts.Call] = []
        stale: list[tuple[str, str]] = []  # index entries whose hash is gone
        now_arg = now if self.clock else 0
        for p, (due, ret) in cands.items():
            items: list[tuple[float, int, list[Any], str, str]] = []  # sort key, args, keys
            for job_id, score in due:
                f = next(fields)
                if f[0] is None:  # job hash gone (deleted out of band): drop its index entry
                    stale.append((keys.due(p), job_id))
                    continue
                items.append(self._job_item(job_id, score, f, now))
            for rid, score in ret:
                f = next(fields)
                if f[0] is None:
                    stale.append((keys.retry(p), rid))
                    continue
                job_id = rid.rsplit("@", 1)[0]
                items.append((score, 0, ["r", f[2].decode(), job_id, rid, f[1].decode(),
                                         "0", "0", "1"], job_id, rid))
            items.sort(key=lambda it: (it[0], -it[1]))
            calls.append(self._claim_call(p, owned[p], now_arg, items))
        if stale:
            # Without this a stale head would look due forever and the loop would never sleep.
            pipe = self.r.pipeline(transaction=False)
            for key, member in stale:
                pipe.zrem(key, member)
            await pipe.execute()
            log.warning("dropped %d index entries whose job or run hash is gone", len(stale))
        lost = []
        for p, res in zip(cands, await scripts.acall_many(self.r, calls), strict=False):
            if isinstance(res, Exception):
                log.error("claim on partition %d failed: %s", p, res)
                continue
            if int(res[0]) == -1:
                lost.append(p)
                continue
            out.dispatched += int(res[0])
            out.skipped += int(res[1])
            if res[2] not in (b"", ""):
                e = float(res[2])
                earliest = e if earliest is None else min(earliest, e)
        out.lost = tuple(lost)
        out.earliest_ms = None if earliest is None else int(earliest)
        return out

    def _job_item(self, job_id: str, score: float, f: list[Any], now: int) -> tuple[Any, ...]:
        next_ms, queue, cron = (v.decode() if v is not None else "" for v in f[1:4])
        sp = unpack_spec(f[4])
        expected = int(next_ms or 0)
        nxt, nxt_score, fire = 0, 0, "1"
        if cron:
            sched = parse_cron(cron, sp.get("tz") or "UTC")
            nxt = sched.next_after(expected)
            if nxt <= now - self.catchup_ms:
                # Missed more than one occurrence (downtime): run the missed one once, then resume
                # from now, instead of a catch-up storm.  Mere lag below catchup_ms loses nothing.
                nxt = sched.next_after(now)
            nxt_score = nxt + jitter_offset_ms(job_id, nxt, int(sp.get("jitter_ms") or 0))
            if sp.get("misfire") == "skip" and now - expected > self.misfire_grace_ms:
                fire = "0"
        priority = int(sp.get("priority") or 0)
        rid = make_run_id(job_id, expected)
        args = ["j", queue, job_id, rid, next_ms or "0", nxt, nxt_score, fire]
        return (score, priority, args, job_id, rid)

    def _claim_call(
        self, p: int, fence: int, now: int, items: list[tuple[Any, ...]]
    ) -> scripts.Call:
        queues: dict[str, int] = {}
        item_keys: list[str] = []
        args: list[Any] = []
        for _, _, a, job_id, rid in items:
            q = queues.setdefault(a[1], len(queues) + 1)
            args += [a[0], q, *a[2:]]
            item_keys += [keys.job(p, job_id), keys.run(p, rid)]
        ks = [keys.lease(p), keys.due(p), keys.retry(p), keys.events(p), keys.stats(p)]
        ks += [keys.stream(p, q) for q in queues]
        ks += item_keys
        head = [self.owner, fence, now, self.events_maxlen, len(queues), len(items), keys.GROUP]
        return ("claim", ks, head + args)
