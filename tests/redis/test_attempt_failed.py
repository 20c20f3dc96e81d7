"""AttemptFailed, what the HTTP target handler raises: final=True dead-letters the run at once
whatever attempts remain (complete.lua's retry delay -1); retry_after makes the retry wait at
least that long, capped by the job's backoff cap.  A worker rig on one real Redis."""

from __future__ import annotations

import asyncio

import redis
from support.helpers import ManualClock, Rig, redis_now_ms

from rsched import App, AttemptFailed, Client, JobContext, RunState
from rsched.rdb import keys


def failing_app() -> App:
    app = App("failing")

    @app.job("gone")
    async def gone(ctx: JobContext) -> None:
        raise AttemptFailed("HTTP 404 from POST https://example.com/h: no", final=True)

    @app.job("later")
    def later(ctx: JobContext) -> None:
        raise AttemptFailed("HTTP 503", retry_after=20)

    return app


async def run_all(rig: Rig, n: int) -> None:
    """Fetch the ``n`` runs dispatched (a fetch reads a few per stream) and report them."""
    got = reported = 0
    for _ in range(100):
        got += await rig.fetch()
        if got >= n:
            break
    for _ in range(100):
        reported += await rig.finish()
        if reported >= n:
            break
    assert (got, reported) == (n, n)


def test_a_final_failure_dead_letters_at_once_with_attempts_left(
        redis_url: str, client: Client, clock: ManualClock) -> None:
    job = client.schedule("gone", run_at=clock() - 100, max_attempts=5)

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            await run_all(rig, 1)

    asyncio.run(scenario())
    run = client.get_run(f"{job.id}@{job.next_ms}")
    assert (run.state, run.attempt) == (RunState.DEAD, 1)
    assert run.error == "HTTP 404 from POST https://example.com/h: no"  # no traceback


def test_retry_after_delays_the_retry_up_to_the_backoff_cap(
        redis_url: str, client: Client, r: redis.Redis, clock: ManualClock) -> None:
    short = client.schedule("later", run_at=clock() - 100, backoff_base_ms=100)
    capped = client.schedule("later", run_at=clock() - 100, backoff_base_ms=100,
                             backoff_cap_ms=5_000)

    async def scenario() -> None:
        async with Rig(redis_url, failing_app(), clock=clock) as rig:
            await run_all(rig, 2)

    asyncio.run(scenario())
    now = redis_now_ms(r)
    for job, low, high in ((short, 19_000, 20_500), (capped, 4_000, 5_500)):
        rid = f"{job.id}@{job.next_ms}"
        assert client.get_run(rid).state is RunState.RETRY_WAIT
        due = r.zscore(keys.retry(job.partition), rid)
        assert due is not None
        assert low < due - now <= high, (due - now, job.backoff_cap_ms)
