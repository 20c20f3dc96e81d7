"""The API's shared readers of the partitions' events streams: while anything in this process
follows a partition (a request waiting for a run to end, an SSE stream), one task reads that
partition's stream with a blocking XREAD and hands each event to every subscriber.  A thousand
waiting requests cost one read per partition, not one each, and wake only for their own run's
events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from rsched.aclient import AsyncClient
from rsched.archive.events import EventRow
from rsched.core.models import Run, job_of_run, partition_of
from rsched.service.jobs import op_read_runs
from rsched.service.run_events import BLOCK_MS, ENDING, Cursor, op_next_events, op_start

log = logging.getLogger("rsched.api")

Deliver = Callable[[str, EventRow], None]
"""A subscriber: called with each event and its id."""


class EventHub:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        # Per partition, its subscribers by a token of their own (one callable may subscribe
        # twice: each subscription counts).
        self._subs: dict[int, dict[object, Deliver]] = {}
        self._cursors: dict[int, Cursor] = {}
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._starting: dict[int, asyncio.Future[None]] = {}
        self._run_ends: dict[str, set[asyncio.Future[Run | None]]] = {}

    @asynccontextmanager
    async def run_end(self, run_id: str) -> AsyncIterator[Callable[[], asyncio.Future[Run | None]]]:
        """While the block lasts, the run's ending events are watched: yields a function that
        gives a future resolved with the run as read after its next ending event.  The runs
        ended by one read of the stream are read back in one round trip for all their
        waiters, not one each."""
        mine: list[asyncio.Future[Run | None]] = []

        def next_end() -> asyncio.Future[Run | None]:
            fut: asyncio.Future[Run | None] = asyncio.get_running_loop().create_future()
            self._run_ends.setdefault(run_id, set()).add(fut)
            mine.append(fut)
            return fut

        try:
            async with self.subscription(partition_of(job_of_run(run_id)), _ignore):
                yield next_end
        finally:
            waiting = self._run_ends.get(run_id, set())
            for fut in mine:
                fut.cancel()
                waiting.discard(fut)
            if not waiting:
                self._run_ends.pop(run_id, None)

    @asynccontextmanager
    async def subscription(self, p: int, deliver: Deliver) -> AsyncIterator[str]:
        """Hand ``deliver`` every event of partition ``p`` from now on, until the block ends;
        yields the id of the last event the partition's reader had read when it began (every
        event after it reaches ``deliver``)."""
        token = object()
        self._subs.setdefault(p, {})[token] = deliver
        try:
            while p not in self._readers:  # start its reader, or wait for the one starting it
                if p in self._starting:
                    await asyncio.shield(self._starting[p])
                    continue  # started, or failed: then this one tries (and raises) itself
                started = asyncio.get_running_loop().create_future()
                self._starting[p] = started
                try:
                    self._cursors[p] = await self.client.run(op_start(p, None))
                    self._readers[p] = asyncio.create_task(self._read(p))
                finally:
                    self._starting.pop(p)
                    started.set_result(None)
            yield self._cursors[p].last_event
        finally:
            self._subs.get(p, {}).pop(token, None)

    async def _read(self, p: int) -> None:
        """Read and hand out the partition's events while it has subscribers."""
        cur = self._cursors[p]
        try:
            while self._subs.get(p):
                try:
                    events = await self.client.run(op_next_events(p, cur, BLOCK_MS))
                except Exception as e:  # noqa: BLE001 - Redis away: waiters time out meanwhile
                    log.debug("events of partition %s: %s", p, e)
                    await asyncio.sleep(0.5)
                    continue
                for event_id, row in events:
                    for deliver in list(self._subs.get(p, {}).values()):
                        deliver(event_id, row)
                await self._read_ended(events)
        finally:
            self._readers.pop(p, None)
            self._cursors.pop(p, None)

    async def _read_ended(self, events: list[tuple[str, EventRow]]) -> None:
        """Hand each waiter of a run these events ended its run as read now (one round trip)."""
        ids = list(dict.fromkeys(row.run_id for _, row in events
                                 if row.event in ENDING and row.run_id in self._run_ends))
        if not ids:
            return
        try:
            runs = await self.client.run(op_read_runs(ids))
        except Exception as e:  # noqa: BLE001 - the waiters read their run at their timeout
            log.debug("ended runs: %s", e)
            return
        for rid, run in zip(ids, runs, strict=True):
            for fut in self._run_ends.pop(rid, ()):
                if not fut.done():
                    fut.set_result(run)

    async def close(self) -> None:
        for task in list(self._readers.values()):
            task.cancel()
        if self._readers:
            await asyncio.wait(list(self._readers.values()))


def _ignore(event_id: str, row: EventRow) -> None:
    """A subscriber that only keeps its partition's reader going (run_end)."""


__all__ = ["Deliver", "EventHub"]
