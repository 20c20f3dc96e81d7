"""Claimer: one batch of due occurrences and retries per owned partition, two round trips.

1. candidates: the earliest due jobs and retries of every owned partition (one pipeline);
2. one claim script per partition (one pipeline), which re-checks everything atomically against
   Redis's clock and the caller's fencing token.  One-off jobs and retries need nothing more:
   the script reads them and picks their queue stream.  Recurring jobs come back from the first
   call (their next time is computed in Python, by _recurring.RecurringJobs), then go through
   a second pair of round trips: read their schedule fields, claim with the computed times.
   RecurringJobs remembers which job ids are recurring, so later rounds send them the second
   way at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rsched.core import defaults
from rsched.core.models import job_of_run
from rsched.core.settings import Settings
from rsched.core.wire import CLAIM_RETRY, ClaimItem
from rsched.engine._calls import CallMany
from rsched.engine.dispatcher._recurring import Due as _Due
from rsched.engine.dispatcher._recurring import RecurringJobs
from rsched.rdb import claim_script, scripts
from rsched.rdb.claim_script import ClaimReply
from rsched.rdb.due_reads import DueRead, read_round

log = logging.getLogger("rsched.dispatcher")

_Read = dict[int, list[bytes]]  # per partition: due one-off jobs' ids as read

CLAIMS_IN_FLIGHT = 2  # claim scripts queued in Redis at once
FULL_READ_S = 0.1  # skip_idle rounds still read every partition this often (see run_once)
HORIZON_MS = 20  # a round reads entries due this far past its clock estimate (see _read_due)


@dataclass
class ClaimResult:
    dispatched: int = 0
    skipped: int = 0
    earliest_ms: int | None = None  # earliest due time left in the owned partitions
    full: bool = False  # some partition had a full batch: call again at once
    lost: tuple[int, ...] = ()  # partitions whose fence was stale
    now_ms: int | None = None  # the clock the round was judged by
    left: dict[int, float] = field(default_factory=dict)  # per partition: earliest score its
    # claim script saw left (inf: nothing left)


@dataclass
class Claimer:
    r: Any  # redis.asyncio.Redis
    owner: str
    batch: int = defaults.CLAIM_BATCH
    events_maxlen: int = 0
    clock: Callable[[], int] | None = None  # injected ms clock (tests); None = Redis TIME
    full_read_s: float = FULL_READ_S  # skip_idle rounds still read every partition this often
    call_many: CallMany = scripts.acall_many  # how the claim scripts are sent
    run_ttl_ms: int = 0  # how long a run its overlap policy skipped is kept (Settings; 0 = ever)
    # A job's history list bound (Settings): runs the claim skips or ends are recorded in it.
    history_len: int = field(default_factory=lambda: Settings().history_len)
    horizon_ms: int = HORIZON_MS  # how far the clock estimate may lag Redis's TIME

    _offset_ms: int = 0  # Redis clock minus local clock, from the last round's TIME
    _offsets: dict[int, int] = field(default_factory=dict)  # the same per partition (its node's)
    _queues: dict[int, list[str]] = field(default_factory=dict)  # each partition's queues
    _next: dict[int, float] = field(default_factory=dict)  # partition -> earliest score seen
    _full_at: float = float("-inf")  # monotonic time of the last round that read every partition
    _forgotten: set[int | None] = field(default_factory=set)  # forget() calls during a round
    _recurring: RecurringJobs = field(init=False, repr=False)  # which ids recur; their items

    def __post_init__(self) -> None:
        self._recurring = RecurringJobs()

    def _estimate_now(self) -> int:
        return int(time.time() * 1000) + self._offset_ms

    def forget(self, partition: int | None = None) -> None:
        """Something may now be due earlier in ``partition`` (None: in any) than the last read
        said: the next skip_idle round reads it.  Called on a client's wake message."""
        if partition is None:
            self._next.clear()
        else:
            self._next.pop(partition, None)
        self._forgotten.add(partition)  # a round under way may have read it before the change

    async def run_once(self, owned: dict[int, int], *, skip_idle: bool = False) -> ClaimResult:
        """One round over the owned partitions.

        skip_idle (the dispatcher's own loop): read only partitions whose earliest entry, as last
        seen, is due by the horizon, or which were never read or were named by a wake message;
        still every partition at least every FULL_READ_S, for what changes unannounced (a
        worker's retry).  Under light load a round then costs a few commands instead of four
        per owned partition: reading them all kept the dispatcher busy at a light load and
        raised its start lag (docs/performance.md).
        """
        out = ClaimResult()
        if not owned:
            self._next.clear()
            return out
        now_est = self.clock() if self.clock else self._estimate_now()
        # Only entries due by (estimated Redis time + margin) come back, plus each set's head for
        # the sleep computation: a round costs O(due), not O(batch), when little is due.  Each
        # partition's estimate is its own master's clock (on a cluster a master whose clock runs
        # ahead of the first one's would otherwise see its jobs up to that skew late).
        horizon = self._horizons(now_est)
        self._forgotten.clear()
        parts = self._parts_to_read(owned, horizon, skip_idle)
        if not parts:
            out.now_ms = now_est
            out.earliest_ms = self._earliest(owned)
            return out
        now, clocks, parts, res = await self._read_due(parts, horizon)
        out.now_ms = now
        plain, once, recurring = self._candidates(parts, res, clocks, out)
        if plain or once or recurring:
            await self._claim_candidates(plain, once, recurring, owned, clocks, out)
        self._drop_forgotten()
        out.earliest_ms = self._earliest(owned)
        return out

    def _horizons(self, now_est: int) -> Callable[[int], int]:
        """Each partition's horizon: how far its due entries are read, by its own master's clock
        as estimated (the first master's estimate ``now_est`` shifted by the two masters' last
        TIME offsets; with an injected clock, that clock)."""
        if self.clock:
            return lambda p: now_est + self.horizon_ms
        first = self._offset_ms
        return lambda p: now_est + self._offsets.get(p, first) - first + self.horizon_ms

    def _parts_to_read(self, owned: dict[int, int], horizon: Callable[[int], int],
                       skip_idle: bool) -> list[int]:
        """The partitions this round reads (see run_once); forgets those no longer owned."""
        known = self._next
        for p in [p for p in known if p not in owned]:
            del known[p]
        mono = time.monotonic()
        if not skip_idle or mono - self._full_at >= self.full_read_s:
            self._full_at = mono
            return sorted(owned)
        return [p for p in sorted(owned) if known.get(p, horizon(p)) <= horizon(p)]

    async def _read_due(self, parts: list[int], horizon: Callable[[int], int]
                        ) -> tuple[int, dict[int, int], list[int], list[DueRead]]:
        """The round's clocks, then per partition its due and retry entries up to the horizon,
        each set's head, and its queues until known (one pipeline: rdb.due_reads.read_round).

        Each partition is judged by the TIME of the node that holds it (on a cluster one TIME
        per master): which entries are due, and a cron job's catch-up, are decided by the same
        clock its claim script reads.  Due-set entries up to the clock estimate come without
        their scores (the estimate lags TIME by up to a round trip, and claim.lua checks each
        one-off job's next_ms by its node's clock anyway), those from there to the horizon with
        them, kept when TIME says they are due.  Returns (the first clock, the clock per
        partition, parts, their reads).  A partition whose reads failed (its cluster master is
        down) is left out of this round rather than failing it: partitions on healthy masters
        go on.  Without TIME the clock is the local one plus the last offset seen."""
        local = int(time.time() * 1000)
        injected = self.clock() if self.clock else None
        # Due by the partition's clock as estimated (its node's last TIME offset, which lags
        # its TIME by up to a round trip); what lies between that estimate and the horizon
        # comes with scores, and _candidates takes what the TIME read here says is due.
        bounds = [(injected if injected is not None
                   else local + self._offsets.get(p, self._offset_ms)) + 0.5 for p in parts]
        times, clock_of, reads = await read_round(
            self.r, parts, bounds, [horizon(p) for p in parts], self.batch, self._queues)
        local = int(time.time() * 1000)
        nows = [None if isinstance(t, Exception) else t for t in times]
        known = [n for n in nows if n is not None]
        if known:
            self._offset_ms = known[0] - local
        fallback = local + self._offset_ms
        if injected is not None:
            fallback = injected
            nows = [fallback] * len(nows)
        clocks = {p: nows[clock_of[i]] or fallback for i, p in enumerate(parts)}
        for i, p in enumerate(parts):
            if nows[clock_of[i]] is not None:
                self._offsets[p] = clocks[p] - local
        ok_parts: list[int] = []
        ok_reads: list[DueRead] = []
        for p, read in zip(parts, reads, strict=True):
            if isinstance(read, Exception):
                log.warning("partition %d unreadable this round: %s", p, read)
            else:
                ok_parts.append(p)
                ok_reads.append(read)
        if not ok_parts and parts and not known:
            raise next(t for t in times if isinstance(t, Exception))  # Redis is away
        return (known[0] if known and not self.clock else fallback), clocks, ok_parts, ok_reads

    def _candidates(self, parts: list[int], reads: list[DueRead], clocks: dict[int, int],
                    out: ClaimResult) -> tuple[dict[int, list[ClaimItem]], _Read, _Due]:
        """What _read_due read, sorted by how it is claimed: retries and one-off jobs as read,
        recurring jobs once their next time is computed.  Notes each partition's head; each
        partition's entries are judged by its own node's clock (``clocks``)."""
        inf = float("inf")
        known, cron = self._next, self._recurring.ids
        plain: dict[int, list[ClaimItem]] = {}  # claimable as read: retries
        once: _Read = {}  # claimable as read: one-off jobs' ids, as the bytes read
        recurring: _Due = {}  # need their next time first
        for p, (due, near, due_head, ret, ret_head, queues) in zip(parts, reads, strict=True):
            now = clocks[p]
            # A due score is the due ms minus priority/2048: due once it is <= now + 0.5.
            cutoff = now + 0.5
            if queues:
                # None yet (a dispatcher started before any job): not kept, read again next
                # round, or the first jobs would all be handed back and claimed the recurring
                # way (2 more round trips and a read per job, for a whole first burst).
                self._queues[p] = queues
            if len(due) >= self.batch or len(near) >= self.batch or len(ret) >= self.batch:
                out.full = True
            # The partition's earliest entry as read; a claim replaces it with what its script
            # saw left.
            known[p] = min(due_head[0][1] if due_head else inf, ret_head[0][1] if ret_head else inf)
            if near and near[0][1] <= cutoff and len(due) < self.batch:
                due = due + [m for m, sc in near[:self.batch - len(due)] if sc <= cutoff]
            if due and cron:  # some ids are known to recur: sort them out (decoding every id)
                ones = []
                for m in due:
                    job_id = m.decode()
                    if job_id in cron:
                        recurring.setdefault(p, []).append((job_id, None))
                    else:
                        ones.append(m)
                due = ones
            if due:
                once[p] = due
            items: list[ClaimItem] = []
            for m, sc in ret:
                if sc > now:
                    break
                items.append(retry_item(m.decode(), sc))
            if items:
                plain[p] = items
        return plain, once, recurring

    async def _claim_candidates(self, plain: dict[int, list[ClaimItem]], once: _Read,
                                recurring: _Due, owned: dict[int, int],
                                clocks: dict[int, int], out: ClaimResult) -> None:
        """Claim retries and one-off jobs, then recurring jobs (with those the first claims
        handed back as recurring); note what each partition's script saw left."""
        # 0: each claim script reads its own node's TIME; an injected clock is passed as is.
        now_arg = next(iter(clocks.values()), 0) if self.clock else 0
        if plain or once:
            needs = await self._claim(plain, owned, now_arg, out, once)
            for p, ids in needs.items():
                recurring.setdefault(p, []).extend(ids)
        if recurring:
            await self._claim_recurring(recurring, owned, clocks, now_arg, out)
        self._next.update(out.left)
        for p in out.lost:
            self._next.pop(p, None)

    def _drop_forgotten(self) -> None:
        for p in self._forgotten:
            if p is None:
                self._next.clear()
            else:
                self._next.pop(p, None)

    def _earliest(self, owned: dict[int, int]) -> int | None:
        """The earliest due ms known in the owned partitions (None: all empty or unknown), by
        the round's clock (ClaimResult.now_ms, the first master's): each partition's entry is
        due by its own master's clock, shifted by the two clocks' last offsets, so the
        dispatcher does not sleep a skew too long (an injected clock is every partition's)."""
        first = self._offset_ms
        shift = (lambda p: 0) if self.clock else (lambda p: first - self._offsets.get(p, first))
        e = min((self._next.get(p, float("inf")) + shift(p) for p in owned),
                default=float("inf"))
        return None if e == float("inf") else int(round(e))

    async def _claim(self, calls_by_part: dict[int, list[ClaimItem]], owned: dict[int, int],
                     now_arg: int, out: ClaimResult,
                     once: _Read | None = None,
                     actives: dict[int, list[str]] | None = None) -> _Due:
        """One claim script per partition; returns the job ids handed back, with their scores.

        The calls go out as soon as their arguments are built, CLAIMS_IN_FLIGHT at a time:
        Redis runs one partition's script while Python builds the next, and workers' reads and
        reports get their turn between two scripts instead of waiting behind all of them."""
        once, actives = once or {}, actives or {}
        parts = sorted({*calls_by_part, *once})
        slots = asyncio.Semaphore(CLAIMS_IN_FLIGHT)

        async def claim(p: int) -> Any:
            call = self._claim_call(p, owned[p], now_arg, calls_by_part.get(p, []),
                                    once.get(p, []), actives.get(p, []))
            async with slots:
                return (await self.call_many(self.r, [call]))[0]

        results = await asyncio.gather(*(claim(p) for p in parts))
        needs: _Due = {}
        lost = list(out.lost)
        for p, res in zip(parts, results, strict=True):
            if isinstance(res, Exception):
                log.error("claim on partition %d failed: %s", p, res)
                self._next.pop(p, None)  # read it again next round
                continue
            reply = ClaimReply.of(res)
            if reply.stale:
                lost.append(p)
                continue
            out.dispatched += reply.dispatched
            out.skipped += reply.skipped
            out.left[p] = reply.left
            if handed := reply.handed:
                for m in once.get(p, []):
                    if (job_id := m.decode()) in handed:
                        needs.setdefault(p, []).append((job_id, None))
                for it in calls_by_part.get(p, []):
                    if it.kind == CLAIM_RETRY and it.run_id in handed:
                        # A retry on a queue this claimer did not know: reload the partition's
                        # queues and go again at once.
                        self._queues.pop(p, None)
                        out.full = True
                    elif it.job_id in handed:
                        needs.setdefault(p, []).append((it.job_id, it.score))
        out.lost = tuple(lost)
        return needs

    async def _claim_recurring(self, cands: _Due, owned: dict[int, int],
                               clocks: dict[int, int], now_arg: int, out: ClaimResult) -> None:
        """Read recurring jobs' schedules, compute their next times (each by its partition's
        node clock), claim them."""
        items_by_part, actives = await self._recurring.items(self.r, cands, clocks,
                                                             self._queues)
        if items_by_part:
            needs = await self._claim(items_by_part, owned, now_arg, out, actives=actives)
            for p, ids in needs.items():
                log.error("partition %d: jobs %s handed back twice (queue %s?)", p,
                          [j for j, _ in ids][:5], self._queues.get(p))

    def _claim_call(self, p: int, fence: int, now: int, items: list[ClaimItem],
                    once: Sequence[bytes] = (), actives: Sequence[str] = ()) -> scripts.Call:
        """The claim script call of one partition; ``once``: one-off jobs' ids as read,
        ``actives``: the active runs of its overlap items as read."""
        return claim_script.call(p, self.owner, fence, now, self.events_maxlen, self.run_ttl_ms,
                                 self.history_len, self._queues.get(p) or [], items, once, actives)


def retry_item(run_id: str, due_ms: float) -> ClaimItem:
    """The claim item of a due retry."""
    return ClaimItem(CLAIM_RETRY, job_of_run(run_id), run_id, due_ms, 0, 0, 0, 1)
