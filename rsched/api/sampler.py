"""The API's background sampler: every stats_sample_ms, one sample of the cluster's counters for
the overview's history charts (rsched.service.samples).  Here, in the API, because the engine's
loops stay on core and rdb; an API serves every dashboard, so its samples are there to show."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rsched.aclient import AsyncClient
from rsched.service.samples import op_record

log = logging.getLogger("rsched.api")


class Sampler:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.period_s = client.settings.stats_sample_ms / 1000

    async def run_once(self) -> dict[str, Any] | None:
        """One sample; None when Redis is away (the charts get a gap, the API goes on)."""
        try:
            return await self.client.run(op_record(self.client))
        except Exception as e:  # noqa: BLE001 - a lost sample must never stop the API
            log.warning("overview sample skipped: %s", e)
            return None

    async def run(self, stop: asyncio.Event) -> None:
        """A sample at start, then one per period, each just after its bucket begins."""
        while not stop.is_set():
            await self.run_once()
            loop_s = asyncio.get_running_loop().time()
            wait = self.period_s - (loop_s % self.period_s) + 0.05
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except TimeoutError:
                pass


__all__ = ["Sampler"]
