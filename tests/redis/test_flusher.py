"""When a worker reports outcomes (the Flusher, its real loops against a real redis-server): an
outcome waits up to flush_ms for handlers still running, so that one report holds theirs too,
and goes at once when no handler is left running."""

from __future__ import annotations

import asyncio
import time

from support.helpers import run_engine

from rsched import App, Client, JobContext, JobSpec, JobStatus

LONG_FLUSH_MS = 20_000  # far longer than any test here waits


def flush_app(ran: list[str], gate: asyncio.Event, slow_in: asyncio.Event | None = None) -> App:
    """'quick' returns (once a 'slow' one runs, given ``slow_in``); 'slow' waits for ``gate``."""
    app = App("flush")

    @app.job("quick")
    async def quick(ctx: JobContext) -> None:
        if slow_in is not None:
            await slow_in.wait()
        ran.append(ctx.job_id)

    @app.job("slow")
    async def slow(ctx: JobContext) -> None:
        if slow_in is not None:
            slow_in.set()
        ran.append(ctx.job_id)
        await gate.wait()

    return app


def completed(client: Client, job_id: str) -> bool:
    return client.get(job_id).status is JobStatus.COMPLETED


def test_outcomes_are_reported_at_once_when_no_handler_is_left_running(
    redis_url: str, client: Client
) -> None:
    ids = [j.id for j in client.schedule_many([JobSpec("quick") for _ in range(5)])
           if not isinstance(j, Exception)]
    assert len(ids) == 5
    ran: list[str] = []
    asyncio.run(run_engine(redis_url, flush_app(ran, asyncio.Event()),
                           lambda: all(completed(client, i) for i in ids),
                           timeout_s=5, worker_kw={"flush_ms": LONG_FLUSH_MS}))
    assert sorted(ran) == sorted(ids)


def test_an_outcome_waits_up_to_flush_ms_while_another_handler_still_runs(
    redis_url: str, client: Client
) -> None:
    quick, slow = client.schedule_many([JobSpec("quick"), JobSpec("slow")])
    assert not isinstance(quick, Exception) and not isinstance(slow, Exception)
    ran: list[str] = []

    async def scenario() -> None:
        gate, slow_in = asyncio.Event(), asyncio.Event()

        async def checks() -> None:
            try:
                while len(ran) < 2:
                    await asyncio.sleep(0.01)
                t_ran = time.monotonic()
                await asyncio.sleep(0.4)
                assert not completed(client, quick.id)  # held for the slow one's outcome
                while not completed(client, quick.id):  # then reported all the same
                    await asyncio.sleep(0.02)
                assert 0.8 <= time.monotonic() - t_ran < 4  # flush_ms, not the slow handler
                assert not completed(client, slow.id)
            finally:
                gate.set()

        await run_engine(redis_url, flush_app(ran, gate, slow_in),
                         lambda: completed(client, slow.id), timeout_s=10,
                         worker_kw={"flush_ms": 1_200}, while_running=checks)

    asyncio.run(scenario())
