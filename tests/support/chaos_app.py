"""The app the chaos tests' worker processes load (`rsched worker --app support.chaos_app:app`).

Every handler records each execution in the same Redis, keyed by run id, so a test can count
how often each occurrence really ran: a start before the work, a finish after it.  A process
killed mid-run leaves a start without a finish.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis

from rsched import App, JobContext

STARTS = "chaos:starts"  # HASH run id -> executions started
FINISHES = "chaos:finishes"  # HASH run id -> executions that ran to the end
LOG = "chaos:log"  # LIST "<run id> <attempt> <worker id> <start|finish>", in order

app = App("chaos")
_client: redis.Redis | None = None
_client_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client per process; handlers run in many threads at once, hence the lock (a second
    client built by a racing thread would close the first one's connections when collected)."""
    global _client
    with _client_lock:
        if _client is None:
            # CHAOS_SINK_URL: a sink reached directly while the worker's own connections go
            # through a proxy a test freezes.
            url = os.environ.get("CHAOS_SINK_URL") or os.environ["RSCHED_REDIS_URL"]
            _client = redis.Redis.from_url(url)
        return _client


def _record(ctx: JobContext, what: str) -> None:
    pipe = _redis().pipeline(transaction=False)
    pipe.hincrby(STARTS if what == "start" else FINISHES, ctx.run_id, 1)
    pipe.rpush(LOG, f"{ctx.run_id} {ctx.attempt} {ctx.worker_id} {what}")
    pipe.execute()


@app.job("record")
def record(ctx: JobContext) -> dict[str, Any]:
    """A no-op that counts itself."""
    _record(ctx, "start")
    _record(ctx, "finish")
    return {"attempt": ctx.attempt}


@app.job("sleep")
def sleep(ctx: JobContext) -> dict[str, Any]:
    """Sleeps payload["sleeps"][attempt - 1] seconds (the last value for later attempts).

    A sync handler on purpose: a thread cannot be cancelled, which is the hard case for a
    worker that must stop within its grace period.  It returns early once ``ctx.cancelled``
    (overlap cancelPrevious asked it to stop), as a well-behaved sync handler does.
    """
    sleeps = ctx.payload["sleeps"]
    seconds = float(sleeps[min(ctx.attempt, len(sleeps)) - 1])
    _record(ctx, "start")
    until = time.monotonic() + seconds
    while not ctx.cancelled and (left := until - time.monotonic()) > 0:
        time.sleep(min(left, 0.02))
    _record(ctx, "finish")
    return {"slept": seconds, "attempt": ctx.attempt}


@app.job("fail")
def fail(ctx: JobContext) -> None:
    """Counts itself, then fails: every attempt (tests/processes/test_lifecycle_fleet.py)."""
    _record(ctx, "start")
    _record(ctx, "finish")
    raise RuntimeError(f"fail {ctx.attempt}")
