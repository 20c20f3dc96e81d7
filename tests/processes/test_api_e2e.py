"""End to end: the real `rsched api`, `rsched dispatcher` and `rsched worker` processes against
the session redis-server, driven only over HTTP."""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched import Client
from rsched.core.settings import Settings
from rsched.service.apikeys import op_create_key

APP = textwrap.dedent('''
    from rsched import App

    app = App("e2e")

    @app.job("greet")
    def greet(ctx):
        return {"hello": ctx.payload["name"], "attempt": ctx.attempt}

    @app.job("tick")
    async def tick(ctx):
        return {"at": ctx.scheduled_ms}
''')






@pytest.fixture(scope="module")
def stack(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, list[Proc]]]:
    """One api, dispatcher and worker for the module (starting them is the slow part)."""
    redis_server.resume()
    if not redis_server.is_running():
        redis_server.start()
    redis_url = redis_server.url
    with redis.Redis.from_url(redis_url) as r:
        r.flushall()
    tmp_path = tmp_path_factory.mktemp("e2e")
    (tmp_path / "e2e_app.py").write_text(APP)
    admin = Client(settings=Settings.from_env(redis_url=redis_url))
    _, secret = admin.run(op_create_key("e2e", "admin"))
    admin.close()
    port = free_port()
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    procs = [
        Proc("api", ["api", "--port", str(port)], env, tmp_path),
        Proc("dispatcher", ["dispatcher", "--max-sleep-ms", "200"], env, tmp_path),
        Proc("worker", ["worker", "--app", "e2e_app:app", "--heartbeat-ms", "500"], env,
             tmp_path),
    ]
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10,
                        headers={"Authorization": f"Bearer {secret}"})
    try:
        wait_for("api ready", lambda: http.get("/readyz").status_code == 200, procs)
        yield http, procs
    finally:
        http.close()
        for p in procs:
            p.stop()


def test_a_job_scheduled_over_http_runs_on_a_real_worker_and_its_run_is_readable(
    stack: tuple[httpx.Client, list[Proc]],
) -> None:
    http, procs = stack
    run_at = datetime.now(UTC) + timedelta(milliseconds=500)
    res = http.post("/jobs", json={"type": "greet", "payload": {"name": "Ada"},
                                   "runAt": run_at.isoformat().replace("+00:00", "Z")})
    assert res.status_code == 201, res.text
    job_id = res.json()["id"]

    def finished() -> Any:
        runs = http.get(f"/jobs/{job_id}/runs").json()["runs"]
        return runs if runs and runs[0]["status"] == "succeeded" else None

    runs = wait_for("the run", finished, procs)
    assert len(runs) == 1
    run = runs[0]
    assert run["result"] == {"hello": "Ada", "attempt": 1}
    assert run["attempt"] == 1 and run["worker"] and run["error"] is None
    assert run["runId"].startswith(f"{job_id}@")
    assert run["startedAt"] >= run["scheduledAt"] and run["endedAt"] >= run["startedAt"]
    assert http.get(f"/jobs/{job_id}").json()["status"] == "completed"

    status = http.get("/status").json()
    assert len(status["dispatchers"]) == 1
    assert [w["alive"] for w in status["workers"]] == [True]


def test_a_cron_job_fires_repeatedly_until_cancelled_over_http(
    stack: tuple[httpx.Client, list[Proc]],
) -> None:
    http, procs = stack
    res = http.post("/jobs", json={"type": "tick", "cron": "* * * * * *", "timeZone": "UTC"})
    assert res.status_code == 201, res.text
    job_id = res.json()["id"]

    def three_succeeded() -> list[dict[str, Any]]:
        runs = http.get(f"/jobs/{job_id}/runs").json()["runs"]
        done = [r for r in runs if r["status"] == "succeeded"]
        return done if len(done) >= 3 else []

    done = wait_for("three runs", three_succeeded, procs)
    scheduled = [r["scheduledAt"] for r in done]
    assert len(set(scheduled)) == len(scheduled)  # one run per second, none twice
    assert all(r["scheduledAt"].endswith(".000Z") for r in done)
    cancelled = http.post(f"/jobs/{job_id}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["nextRunAt"] is None
    time.sleep(1.2)  # a run in progress at cancel time finishes
    settled = http.get(f"/jobs/{job_id}/runs", params={"limit": 1000}).json()["runs"]
    time.sleep(2.1)  # two more seconds of schedule: nothing new may start
    assert http.get(f"/jobs/{job_id}/runs", params={"limit": 1000}).json()["runs"] == settled
