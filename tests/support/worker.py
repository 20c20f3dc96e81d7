"""Helpers of the worker tests (tests/redis/test_worker_*.py): a retry's score, a stream's
pending entries, a one-off job run once, and a handler held by a gate for the reclaim and
fencing scenarios."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import redis

from rsched import App, Client, Job, JobContext
from rsched.engine.worker import Worker
from rsched.rdb import keys
from support.helpers import (
    ManualClock,
    Rig,
)

MINUTE = 60_000


def retry_score(r: redis.Redis, p: int, run_id: str) -> int:
    score = r.zscore(keys.retry(p), run_id)
    assert score is not None, f"{run_id} has no retry scheduled"
    return int(score)


def pending(r: redis.Redis, p: int, queue: str = "default") -> list[dict[str, Any]]:
    return r.xpending_range(keys.stream(p, queue), keys.GROUP, "-", "+", 100)


def run_a_one_off_once(redis_url: str, client: Client, clock: ManualClock) -> tuple[Job, str]:
    """A one-off job of a handler returning None, run once; the job and its own run's id."""
    app = App()

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        return None

    job = client.schedule("t", run_at=clock() - 1)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            assert (await rig.cycle())[1:] == (1, 1)

    asyncio.run(scenario())
    return job, f"{job.id}@{job.next_ms}"


def fast_reclaim(visibility_ms: int) -> dict[str, int]:
    return {"visibility_ms": visibility_ms, "heartbeat_ms": visibility_ms // 3}


def gated_app() -> tuple[App, dict[str, asyncio.Event]]:
    """A handler that runs until the test opens its worker's gate; returns the worker id."""
    app: App = App()
    gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    @app.job("long")
    async def long(ctx: JobContext) -> str:
        await gates[ctx.worker_id].wait()
        return ctx.worker_id

    return app, gates


def long_job(client: Client, clock: ManualClock, max_attempts: int) -> tuple[Job, int, str]:
    """A due run of gated_app's handler: the job, its partition and the run id."""
    job = client.schedule("long", run_at=clock() - 1, max_attempts=max_attempts)
    return job, job.partition, f"{job.id}@{job.next_ms}"


@contextlib.asynccontextmanager
async def fetched_by_w_a(
    redis_url: str, app: App, clock: ManualClock, visibility_ms: int = 100
) -> AsyncIterator[tuple[Rig, Worker]]:
    """The due run claimed and fetched by w-a (the rig's worker), with w-b there to reclaim it;
    both with the same short visibility timeout."""
    async with Rig(redis_url, app, clock=clock, worker_id="w-a",
                   worker_kw=fast_reclaim(visibility_ms)) as rig:
        b = await rig.add_worker("w-b", **fast_reclaim(visibility_ms))
        await rig.claim()
        assert await rig.fetch() == 1
        yield rig, b
