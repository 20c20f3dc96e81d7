"""Example handlers: run them with ``rsched worker --app examples.handlers:app``.

Each shows one thing a scheduler has to get right: a one-off job, a cron job whose schedule
lives in a non-UTC time zone, a flaky job that succeeds on retry, and a job that always fails
and ends in the dead letters.  A handler gets a JobContext (job id, run id, attempt, payload)
and returns a JSON-serializable result; raising marks the attempt as failed.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from zoneinfo import ZoneInfo

from rsched import App, JobContext

log = logging.getLogger("examples")

app = App("examples")


@app.job("hello")
def hello(ctx: JobContext) -> dict[str, str]:
    """A one-off job: runs once, at its runAt time."""
    name = (ctx.payload or {}).get("name", "world")
    time.sleep(0.2)
    log.info("hello, %s", name, extra={"job_id": ctx.job_id, "run_id": ctx.run_id,
                                        "attempt": ctx.attempt})
    return {"greeting": f"hello, {name}"}


@app.job("report")
def report(ctx: JobContext) -> dict[str, str]:
    """A cron job scheduled in the report's own zone: its result says when it ran there."""
    zone = ZoneInfo((ctx.payload or {}).get("timeZone", "UTC"))
    time.sleep(0.5)
    return {"scheduledLocal": ctx.scheduled_at.astimezone(zone).isoformat(),
            "ranLocal": datetime.now(zone).isoformat(timespec="seconds")}


@app.job("flaky")
def flaky(ctx: JobContext) -> dict[str, int]:
    """Fails until attempt ``succeedOnAttempt`` (default 2), as a service that is briefly down.

    Retries keep the run id, so a real handler can use it as an idempotency key downstream."""
    succeed_on = int((ctx.payload or {}).get("succeedOnAttempt", 2))
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"upstream returned 503 on attempt {ctx.attempt}; "
                              f"it recovers on attempt {succeed_on}")
    return {"succeededOnAttempt": ctx.attempt}


@app.job("always_fails")
def always_fails(ctx: JobContext) -> None:
    """Never succeeds: after maxAttempts its run lands in the dead letters for a human."""
    invoice = (ctx.payload or {}).get("invoice", "?")
    raise ValueError(f"invoice {invoice} has no customer record; fix the data, then replay")
