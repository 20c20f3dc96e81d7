"""A worker's process heartbeat and the take-over of dead workers' runs.

Every ``dead_after_ms / 3`` the worker beats in keys.alive() (lua/alive.lua, by Redis's clock),
one call per process whatever its runs; the reply names the workers that have not beaten for
``dead_after_ms``: killed, frozen, or cut off from Redis.  This worker takes over their runs at
once, up to its free slots (rdb.worker_streams.take_over), and starts them under new fences;
once a dead worker has nothing left pending, it is dropped from keys.alive().  A live worker's
long run is never taken: its worker beats.  A worker that finds itself silent past
``dead_after_ms`` (it was frozen) asks at once which of its runs are still its own (the run
heartbeat), which stops the handlers of those taken over meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rsched.engine.worker._link import Link
from rsched.engine.worker.intake import Intake
from rsched.rdb import worker_registry

log = logging.getLogger("rsched.worker")


@dataclass(slots=True)
class Liveness:
    """Beats for this worker; takes over the runs of workers that stopped beating."""

    link: Link
    intake: Intake
    check_runs: Callable[[], Awaitable[Any]]  # the run heartbeat: fences stop stale handlers
    dead_after_ms: int
    taking: bool = True  # off while draining (SIGTERM): the beat goes on, nothing is taken
    _beat_at: float | None = None  # monotonic time the last beat got through

    @property
    def every_s(self) -> float:
        """How often it beats: three beats fit in ``dead_after_ms``, so a pause of up to two
        beats' time is not taken for death."""
        return self.dead_after_ms / 3000

    async def beat(self) -> dict[str, int]:
        """This worker's beat; returns the workers dead by it, with their last beat (0: marked
        dead: it left with runs pending, or its supervisor saw it die)."""
        res = (await self.link.call_many(
            self.link.r, [worker_registry.beat(self.link.id, self.dead_after_ms)]))[0]
        if isinstance(res, Exception):
            raise res
        return worker_registry.dead_of(res)

    async def run_once(self) -> int:
        """Beat; after a silence past ``dead_after_ms``, check our runs; then take over the
        runs of the dead workers.  Returns how many runs it started."""
        started = 0
        dead = await self.beat()
        done = time.monotonic()  # a beat held up (a frozen connection) lands late: silent too
        silent_s = 0.0 if self._beat_at is None else done - self._beat_at
        self._beat_at = done
        if silent_s * 1000 >= self.dead_after_ms:
            log.warning("this worker gave no heartbeat for %.1f s (frozen, or its event loop "
                        "blocked): runs taken over meanwhile are stopped here, unreported",
                        silent_s)
            await self.check_runs()
        for wid, beat_ms in dead.items() if self.taking else ():
            # An entry the dead worker touched within a beat is left alone: it may have woken
            # up since its beat was read.  One marked dead is gone for good.
            min_idle_ms = 0 if beat_ms == 0 else int(self.every_s * 1000)
            n, whole = await self.intake.take_over(wid, min_idle_ms)
            started += n
            if whole:
                await worker_registry.forget_alive(self.link.r, [wid])
        return started
