"""The API's runner of background operations (rsched.service.operations): the request that
starts one hands it over here, and every OPERATION_POLL_S the runner looks for operations
marked running that no live runner holds (their API process died or stalled past the lease)
and resumes them.  Each runs as its own task, a chunk per round trip, so requests are served
in between."""

from __future__ import annotations

import asyncio
import logging

from rsched.aclient import AsyncClient
from rsched.core import defaults
from rsched.core.codes import OperationStep
from rsched.core.ids import process_id
from rsched.service.operations import op_run, op_running_ids

log = logging.getLogger("rsched.api")


class OperationRunner:
    def __init__(self, client: AsyncClient, poll_s: float = defaults.OPERATION_POLL_S) -> None:
        self.client = client
        self.poll_s = poll_s
        self.id = process_id("api")
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, op_id: str) -> None:
        """Work on the operation here unless this process already does."""
        if op_id not in self.tasks:
            self.tasks[op_id] = asyncio.create_task(self._work(op_id))

    async def _work(self, op_id: str) -> None:
        try:
            how = await self.client.run(op_run(self.client, op_id, self.id))
            if how is OperationStep.OTHER:
                log.debug("operation %s: another runner holds it", op_id)
        except Exception as e:  # noqa: BLE001 - logged; a Redis error leaves it to be resumed
            log.warning("operation %s stopped: %s", op_id, e)
        finally:
            self.tasks.pop(op_id, None)

    async def run(self, stop: asyncio.Event) -> None:
        """Resume operations no runner holds, until ``stop``; then stop this process's own
        (their leases lapse and another API process resumes them)."""
        try:
            while not stop.is_set():
                try:
                    for op_id in await self.client.run(op_running_ids()):
                        self.start(op_id)
                except Exception as e:  # noqa: BLE001 - Redis away: look again next time
                    log.debug("operations poll: %s", e)
                try:
                    await asyncio.wait_for(stop.wait(), self.poll_s)
                except TimeoutError:
                    pass
        finally:
            for task in list(self.tasks.values()):
                task.cancel()
            if self.tasks:
                await asyncio.wait(list(self.tasks.values()))


__all__ = ["OperationRunner"]
