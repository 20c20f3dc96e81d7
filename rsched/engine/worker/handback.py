"""Job types a worker has no handler for, on a queue it shares with workers that have them.

A run of such a type that this worker reads is never started here (no attempt spent): it is
set aside in Redis for a worker with the handler (lua/park.lua), which takes it from there
(``find``; the intake starts it, lua/start.lua), and a count per queue and type tells those
workers to look.  A run whose type no live worker has served on its queue for the handler wait
is dead-lettered, saying so.  None of this is on the path of a run this worker has the handler
for: the intake only looks its type up in a set.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

from rsched.core.codes import ParkCode
from rsched.core.settings import Settings
from rsched.core.views import dead_after_ms, worker_record
from rsched.core.wire import ENTRY_RUN, as_text
from rsched.engine.worker._link import Link
from rsched.engine.worker.inflight import Inflight, inflight
from rsched.obs.metrics import RunMetrics
from rsched.rdb import run_scripts, worker_registry, worker_streams
from rsched.rdb.worker_streams import Entry

log = logging.getLogger("rsched.worker")

REGISTRY_TTL_S = 1.0  # how long a read of the worker registry answers who serves what
SAY_AGAIN_S = 60.0  # a queue and type set aside here is logged at most this often

QueueType = tuple[str, str]


@dataclass(slots=True)
class Handback:
    """Sets aside runs of types without a handler here; finds runs others set aside for ours."""

    link: Link
    settings: Settings
    metrics: RunMetrics
    queues: list[str]
    types: frozenset[str]  # the job types this worker has handlers for
    wait_ms: int  # the handler wait: how long a run no live worker serves waits
    visibility_ms: int
    _later: list[Entry] = field(default_factory=list)  # fresh entries to set aside
    _task: asyncio.Task[None] | None = None  # setting them aside
    _registry_at: float = float("-inf")  # monotonic time of the last registry read
    _live: set[QueueType] = field(default_factory=set)  # served by a live worker then
    _served_ms: dict[QueueType, int] = field(default_factory=dict)  # last beat of one serving it
    _counts: dict[str, int] = field(default_factory=dict)  # keys.parked() as last read
    _look: set[QueueType] = field(default_factory=set)  # ours, set aside since our last look
    _said: dict[QueueType, float] = field(default_factory=dict)
    _turn: int = 0

    # --- this worker lacks the handler ---------------------------------------------------------

    def later(self, entries: list[Entry]) -> None:
        """Set ``entries`` aside soon (the intake's synchronous path found them)."""
        self._later += entries
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._set_aside())

    async def _set_aside(self) -> None:
        while self._later:
            entries, self._later = self._later, []
            try:
                await self.park(entries)
            except Exception as e:  # noqa: BLE001 - left pending: XAUTOCLAIM takes them again
                log.warning("could not set aside %d runs without a handler here: %s",
                            len(entries), e)

    async def settle(self) -> None:
        """Wait until the entries handed to ``later`` are set aside (at shutdown)."""
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)

    async def park(self, entries: list[Entry]) -> int:
        """Set aside (or dead-letter, past the handler wait) runs of types without a handler
        here: one park script per partition.  Returns how many were set aside."""
        by_part: dict[int, list[Inflight]] = defaultdict(list)
        for s, eid, f in entries:
            p, queue = self.link.streams[s]
            by_part[p].append(inflight(p, s, queue, eid, as_text(f[ENTRY_RUN]), f, 0, 0.0))
        await self._read_registry()
        calls = run_scripts.park(
            self.link.id, self.settings.events_maxlen, self.wait_ms, self.visibility_ms,
            {p: [(fl, self._served(fl.queue, fl.type)) for fl in fls]
             for p, fls in by_part.items()})
        results = await self.link.call_many(self.link.r, calls)
        parked: dict[QueueType, int] = defaultdict(int)
        for (p, fls), res in zip(by_part.items(), results, strict=True):
            if isinstance(res, Exception):
                log.error("setting runs aside on partition %d failed: %s", p, res)
                continue
            for fl, code in zip(fls, run_scripts.park_codes(res), strict=True):
                if code == ParkCode.PARKED:
                    parked[(fl.queue, fl.type)] += 1
                elif code == ParkCode.DEAD_LETTERED:
                    self.metrics.count("dead_lettered", fl.type, fl.queue)
                    log.warning("run %s dead-lettered: no live worker serves type %r on queue "
                                "%r for %g s (the handler wait)", fl.run_id, fl.type, fl.queue,
                                self.wait_ms / 1000,
                                extra={"job_id": fl.job_id, "run_id": fl.run_id})
        if parked:
            await worker_registry.add_parked(self.link.r, parked)
            self._say(parked)
        return sum(parked.values())

    def _say(self, parked: dict[QueueType, int]) -> None:
        now = time.monotonic()
        for (queue, jtype), n in parked.items():
            if now - self._said.get((queue, jtype), float("-inf")) >= SAY_AGAIN_S:
                self._said[(queue, jtype)] = now
                served = (queue, jtype) in self._live
                whom = ("a live worker that has it takes them" if served
                        else f"no live worker has it: they wait up to {self.wait_ms / 1000:g} s "
                             "for one, then are dead-lettered")
                log.log(logging.INFO if served else logging.WARNING,
                        "%d runs of job type %r on queue %r set aside: no handler for it in "
                        "this worker; %s", n, jtype, queue, whom)

    def _served(self, queue: str, jtype: str) -> int:
        """park.lua's served_ms: -1 when a live worker serves ``jtype`` on ``queue``, else the
        last heartbeat of one that did (0: none seen)."""
        if (queue, jtype) in self._live:
            return -1
        return self._served_ms.get((queue, jtype), 0)

    async def _read_registry(self) -> None:
        """Who serves which type on which queue, from the workers' heartbeat records (at most
        every REGISTRY_TTL_S); the last beat of each is remembered after its record is gone."""
        mono = time.monotonic()
        if mono - self._registry_at < REGISTRY_TTL_S:
            return
        raw = await worker_registry.records(self.link.r)
        self._registry_at = mono
        now = int(time.time() * 1000)
        live: set[QueueType] = set()
        for blob in raw.values():
            rec = worker_record(blob)
            beat = rec.get("beat_ms")
            try:
                served = [(str(q), str(t)) for q in rec.get("queues") or ()
                          for t in rec.get("types") or ()]
            except TypeError:
                continue
            if not isinstance(beat, int):
                continue  # a torn or foreign record serves nothing
            for qt in served:
                if beat > self._served_ms.get(qt, 0):
                    self._served_ms[qt] = beat
                if now < beat + dead_after_ms(rec):  # its record beats went on until lately
                    live.add(qt)
        self._live = live

    # --- this worker has the handler ---------------------------------------------------------

    def more(self) -> bool:
        """Some runs set aside for our types are known to be left (the last look took all it
        could)."""
        return bool(self._look)

    async def find(self, free: int) -> list[Entry]:
        """Up to ``free`` runs of our types on our queues that other workers set aside, as
        entries (their stream, id and fields) for the intake to start; nothing unless the
        counts in keys.parked() moved since we last found everything."""
        r = self.link.r
        for name, n in (await worker_registry.parked_counts(r)).items():
            if self._counts.get(name) == n:
                continue
            self._counts[name] = n
            qt = worker_registry.parked_of(name)
            if qt is not None and qt[0] in self.queues and qt[1] in self.types:
                self._look.add(qt)
        found: list[Entry] = []
        if not self._look:
            return found
        self._turn += 1  # which of them goes first: in turn, so none waits behind another
        look = sorted(self._look)
        k = self._turn % len(look)
        for queue, jtype in look[k:] + look[:k]:
            if free - len(found) <= 0:
                break
            want = free - len(found)
            streams = [s for s, (_, q) in self.link.streams.items() if q == queue]
            ids = await worker_streams.set_aside(r, streams, jtype, want)
            if len(ids) < want:
                self._look.discard((queue, jtype))  # all of them found
            if ids:
                found += await worker_streams.entries_by_id(r, ids)
        return found
