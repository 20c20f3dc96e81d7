"""`rsched worker --app` repeated: one worker serves the handlers of several apps (what
`rsched dev --app a:app --app b:app` runs), its --processes children too; a job type two apps
register is refused at start.  Real dispatcher and worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import Proc, wait_for

from rsched import Client

pytestmark = pytest.mark.slow

APP = '''
from rsched import App

app = App("{name}")


@app.job("{name}.echo")
def echo(ctx):
    return ctx.payload
'''


def test_one_worker_runs_the_jobs_of_every_app_it_was_given(
    redis_url: str, client: Client, tmp_path: Path
) -> None:
    for name in ("billing", "mail"):
        (tmp_path / f"{name}_jobs.py").write_text(APP.format(name=name))
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    procs = [
        Proc("dispatcher", ["dispatcher", "--max-sleep-ms", "200"], env, tmp_path),
        Proc("worker", ["worker", "--app", "billing_jobs:app", "--app", "mail_jobs:app",
                        "--processes", "2", "--heartbeat-ms", "500"], env, tmp_path),
    ]
    try:
        jobs = [client.schedule(f"{name}.echo", {"n": i})
                for i, name in enumerate(("billing", "mail", "billing", "mail"))]
        wait_for("every job completes", lambda: all(
            client.get(j.id).status == "completed" for j in jobs), procs, 60)
        assert [client.runs(j.id)[0].result for j in jobs] == [{"n": i} for i in range(4)]
    finally:
        for p in procs:
            p.stop()


def test_a_job_type_two_apps_register_is_refused_at_start(redis_url: str, tmp_path: Path) -> None:
    for module in ("one", "two"):
        (tmp_path / f"{module}.py").write_text(APP.format(name="same"))
    res = subprocess.run([sys.executable, "-m", "rsched.cli", "--redis-url", redis_url, "worker",
                          "--app", "one:app", "--app", "two:app"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    assert "job type 'same.echo' has a handler in both one:app and two:app" in res.stderr
