"""`rsched dev` stays out of the way (issue 15, items 7 and 8): its banner says where the admin
key is saved and how to run the CLI, the failures of the sample jobs that fail on purpose do not
scroll it away, and the CLI run in its directory finds its Redis.  A real `rsched dev` with its
own redis-server, in a temporary directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import free_port
from test_api_e2e import Proc, wait_for
from test_dev import interrupt, processes_mentioning, running

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for pid in processes_mentioning(str(tmp_path / ".rsched")):  # nothing left behind
        os.kill(pid, signal.SIGKILL)


def test_the_banner_stays_findable_and_the_cli_beside_dev_uses_its_redis(
    redis_available: None, here: Path
) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))  # this checkout
    env.pop("RSCHED_REDIS_URL", None)
    proc = Proc("dev", ["dev", "--port", str(free_port()), "--no-metrics-ports"], env, here)
    try:
        dev = running(proc)
        assert "(saved in .rsched/admin.key)" in dev.banner
        assert "try         rsched jobs list   (in this directory" in dev.banner
        with dev.http() as http:
            jobs = http.get("/jobs", params={"limit": 100}).json()["jobs"]
            doomed = next(j["id"] for j in jobs if j["type"] == "always_fails")
            for _ in range(3):
                assert http.post(f"/jobs/{doomed}/trigger").status_code == 202
        worker_log = here / ".rsched" / "logs" / "worker.log"
        wait_for("a sample job dead-lettered", lambda: "dead-lettered" in worker_log.read_text(),
                 [proc], 60)
        listed = subprocess.run([sys.executable, "-m", "rsched.cli", "jobs", "list"], cwd=here,
                                env=env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0 and doomed in listed.stdout, listed
        assert f"note: using {dev.redis_url}, the Redis of rsched dev" in listed.stderr
    finally:
        assert interrupt(proc) == 0, proc.tail()
    console = proc.log.read_text()
    after_banner = console.split("Press Ctrl-C", 1)[1]
    assert doomed not in after_banner  # the expected failures stayed in the worker log
    assert "warnings and errors of the sample jobs that fail on purpose are in" in after_banner
    assert not (here / ".rsched" / "redis-url").exists()  # gone with the dev Redis
