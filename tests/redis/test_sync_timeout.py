"""A sync handler past its timeout keeps running in its thread (Python cannot stop a thread):
its retry must wait until it returns, so two attempts of one run never execute at once (issue
15, item 5).  The real dispatcher and worker loops, in this process, on the real redis-server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from support.helpers import run_engine

from rsched import App, Client, JobContext

SLOW_S = 3.0  # the first attempt's handler: far past its timeout and the retry's dispatch


def _app(log: list[tuple[str, int]]) -> App:
    app = App("overlap")
    lock = threading.Lock()

    @app.job("stuck")
    def stuck(ctx: JobContext) -> int:
        with lock:
            log.append(("start", ctx.attempt))
        if ctx.attempt == 1:
            time.sleep(SLOW_S)
        with lock:
            log.append(("end", ctx.attempt))
        return ctx.attempt

    return app


@pytest.mark.slow
def test_a_timed_out_sync_handler_is_not_overlapped_by_its_retry(
    redis_url: str, client: Client
) -> None:
    log: list[tuple[str, int]] = []
    # retry at once (no backoff) and dispatched within 100 ms: without the hold, attempt 2
    # would start about 0.3 s in, while attempt 1 sleeps on for 3 s
    job = client.schedule("stuck", timeout_ms=300, max_attempts=3, backoff_base_ms=0)
    asyncio.run(run_engine(
        redis_url, _app(log), lambda: ("end", 2) in log, timeout_s=60,
        dispatcher_kw={"max_sleep_ms": 100}, worker_kw={"heartbeat_ms": 200}))
    assert log == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    attempts = client.runs(job.id)[::-1]  # oldest first
    assert [(a.attempt, a.status) for a in attempts] == [(1, "timed_out"), (2, "succeeded")]
    assert attempts[0].error == "timed out after 0.3 s"
