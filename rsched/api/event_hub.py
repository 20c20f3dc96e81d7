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
from rsched.service.run_events import BLOCK_MS, Cursor, op_next_events, op_start

log = logging.getLogger("rsched.api")

Deliver = Callable[[str, EventRow], None]
"""A subscriber: called with each event and its id."""


class EventHub:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._subs: dict[int, set[Deliver]] = {}
        self._cursors: dict[int, Cursor] = {}
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._starting: dict[int, asyncio.Future[None]] = {}

    @asynccontextmanager
    async def subscription(self, p: int, deliver: Deliver) -> AsyncIterator[str]:
        """Hand ``deliver`` every event of partition ``p`` from now on, until the block ends;
        yields the stream id the partition's reader had reached when it began (every event
        after it reaches ``deliver``)."""
        self._subs.setdefault(p, set()).add(deliver)
        try:
            if p not in self._readers:
                if p not in self._starting:
                    self._starting[p] = asyncio.get_running_loop().create_future()
                    try:
                        self._cursors[p] = await self.client.run(op_start(p, None))
                        self._readers[p] = asyncio.create_task(self._read(p))
                    finally:
                        self._starting.pop(p).set_result(None)
                else:
                    await asyncio.shield(self._starting[p])
            yield self._cursors[p].after
        finally:
            subs = self._subs.get(p)
            if subs is not None:
                subs.discard(deliver)

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
                    for deliver in list(self._subs.get(p, ())):
                        deliver(event_id, row)
        finally:
            self._readers.pop(p, None)
            self._cursors.pop(p, None)

    async def close(self) -> None:
        for task in list(self._readers.values()):
            task.cancel()
        if self._readers:
            await asyncio.wait(list(self._readers.values()))


__all__ = ["Deliver", "EventHub"]
