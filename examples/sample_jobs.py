"""The jobs `rsched dev` schedules at start.

Each has an idempotency key, so scheduling them again (every restart) finds the same jobs
instead of adding new ones.  Change a job's body here and the next start reports a conflict for
that key: cancel the old job, or start over with ``rsched dev --fresh``.
"""

from __future__ import annotations

from rsched import JobSpec

FAIL_ON_PURPOSE = ("flaky", "always_fails")
"""Job types whose failures are the demo: `rsched dev` keeps them out of its console."""

SAMPLE_JOBS = [
    # One-off: runs as soon as the dispatcher sees it.
    JobSpec(type="hello", payload={"name": "rsched"}, idempotency_key="example-hello"),
    # Cron in a non-UTC zone: every 20 seconds (6-field cron, seconds first), Kolkata time.
    JobSpec(type="report", payload={"timeZone": "Asia/Kolkata"}, cron="*/20 * * * * *",
            tz="Asia/Kolkata", idempotency_key="example-report-kolkata"),
    # Cron with DST: 09:30 New York time on weekdays; its page previews the next fire times.
    JobSpec(type="report", payload={"timeZone": "America/New_York"}, cron="30 9 * * 1-5",
            tz="America/New_York", idempotency_key="example-report-new-york"),
    # Flaky: fails its first attempt every time, succeeds on the retry 0-2 s later.
    JobSpec(type="flaky", payload={"succeedOnAttempt": 2}, cron="*/30 * * * * *",
            max_attempts=3, backoff_base_ms=1000, idempotency_key="example-flaky"),
    # Always fails: three attempts, then the run is dead-lettered (once a minute).
    JobSpec(type="always_fails", payload={"invoice": 42}, cron="0 * * * * *", max_attempts=3,
            backoff_base_ms=500, idempotency_key="example-always-fails"),
]


def http_jobs(base_url: str) -> list[JobSpec]:
    """An HTTP target (docs/http-targets.md) against the dev API's own /dev/echo, every 30
    seconds; its key names the port, so a dev on another port schedules its own."""
    port = base_url.rsplit(":", 1)[1]
    return [JobSpec(type="http", payload={"from": "rsched dev"}, cron="*/30 * * * * *",
                    target={"url": f"{base_url}/dev/echo", "method": "POST"},
                    idempotency_key=f"example-http-echo-{port}")]

