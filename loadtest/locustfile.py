"""Locust load for the HTTP API: single POST /jobs, POST /jobs/batch and GET /jobs/{id}/runs.

Pick one user class per run (the figures in README-api.md are per endpoint):

    RSCHED_API_KEY=rsk_... locust -f loadtest/locustfile.py --headless -u 64 -r 64 -t 30s \
        --host http://127.0.0.1:8600 SingleJobUser

Loopback only: run it against an `rsched api` on this machine.  Jobs are one-offs a year
ahead, so a running dispatcher has nothing to do; with no key (RSCHED_API_KEY unset) the API
must run with --no-auth.  `python loadtest/bench_api.py` starts a private redis-server and
`rsched api`, runs each class headless for a bounded time and prints the figures.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from locust import FastHttpUser, constant, events, task

BATCH_SIZE = int(os.environ.get("RSCHED_BATCH_SIZE", "1000"))
AHEAD = (datetime.now(UTC) + timedelta(days=365)).isoformat().replace("+00:00", "Z")
HEADERS = {"Content-Type": "application/json"}
if os.environ.get("RSCHED_API_KEY"):
    HEADERS["Authorization"] = f"Bearer {os.environ['RSCHED_API_KEY']}"

JOB = {"type": "email.send", "payload": {"to": "user@example.com", "template": "welcome"},
       "runAt": AHEAD, "maxAttempts": 5}
SINGLE_BODY = json.dumps(JOB)
BATCH_BODY = json.dumps({"jobs": [JOB] * BATCH_SIZE})


class SingleJobUser(FastHttpUser):
    """One job per request: the API coalesces concurrent requests into one script call."""

    wait_time = constant(0)

    @task
    def create(self) -> None:
        with self.client.post("/jobs", data=SINGLE_BODY, headers=HEADERS, name="POST /jobs",
                              catch_response=True) as res:
            if res.status_code != 201:
                res.failure(f"{res.status_code}: {res.text[:200]}")


class BatchUser(FastHttpUser):
    """BATCH_SIZE jobs per request; jobs/s = requests/s x BATCH_SIZE."""

    wait_time = constant(0)

    @task
    def create_batch(self) -> None:
        with self.client.post("/jobs/batch", data=BATCH_BODY, headers=HEADERS,
                              name="POST /jobs/batch", catch_response=True) as res:
            if res.status_code != 200:
                res.failure(f"{res.status_code}: {res.text[:200]}")
                return
            results = res.json()["results"]
            if len(results) != BATCH_SIZE or any(r["status"] != 201 for r in results):
                res.failure("not every job was created")


class RunsUser(FastHttpUser):
    """GET /jobs/{id}/runs for jobs listed in RSCHED_RUNS_JOBS (comma-separated ids; the bench
    script makes them with a full history), or for a job this user schedules itself."""

    wait_time = constant(0)
    job_ids: list[str] = []

    def on_start(self) -> None:
        ids = os.environ.get("RSCHED_RUNS_JOBS", "")
        self.job_ids = [i for i in ids.split(",") if i]
        if not self.job_ids:
            res = self.client.post("/jobs", data=SINGLE_BODY, headers=HEADERS)
            self.job_ids = [res.json()["id"]]
        self.i = 0

    @task
    def runs(self) -> None:
        self.i = (self.i + 1) % len(self.job_ids)
        with self.client.get(f"/jobs/{self.job_ids[self.i]}/runs?limit=20", headers=HEADERS,
                             name="GET /jobs/{id}/runs", catch_response=True) as res:
            if res.status_code != 200:
                res.failure(f"{res.status_code}: {res.text[:200]}")


@events.quitting.add_listener
def _summary(environment: Any, **_: Any) -> None:
    """One JSON line with the totals, for loadtest/bench_api.py to read."""
    total = environment.stats.total
    elapsed = max(time.time() - total.start_time, 1e-9)
    print(json.dumps({
        "requests": total.num_requests, "failures": total.num_failures,
        "rps": round(total.num_requests / elapsed, 1),
        "p50_ms": total.get_response_time_percentile(0.5),
        "p99_ms": total.get_response_time_percentile(0.99),
        "batch_size": BATCH_SIZE,
    }), flush=True)
