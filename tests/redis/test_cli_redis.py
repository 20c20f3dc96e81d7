"""Which Redis the CLI uses, and that reading never writes (issue 15, item 7): real `rsched`
processes against the real session redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from support.helpers import snapshot

from rsched.core import defaults
from rsched.rdb import keys

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
READS = [["status"], ["status", "--json"], ["dlq", "list"], ["keys", "list"], ["jobs", "list"],
         ["doctor"]]


def cli(*args: str, cwd: Path | None = None, url: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    # this checkout's rsched and the tests' modules, from any working directory
    env = dict(os.environ, RSCHED_DEBUG="", PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    env.pop("RSCHED_REDIS_URL", None)
    if url is not None:
        env["RSCHED_REDIS_URL"] = url
    return subprocess.run([sys.executable, "-m", "rsched.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env, cwd=cwd)


@pytest.mark.parametrize("args", READS, ids=" ".join)
def test_read_commands_leave_an_empty_redis_empty(
    redis_url: str, r: redis.Redis, args: list[str]
) -> None:
    res = cli(*args, url=redis_url)
    assert res.returncode in (0, 1), res  # doctor fails on the test server's AOF being off
    assert "Traceback" not in res.stderr
    assert snapshot(r) == {}, "a read command wrote to Redis"


def test_a_first_schedule_still_stores_the_partition_count(
    redis_url: str, r: redis.Redis
) -> None:
    assert cli("jobs", "add", "--type", "t", "--run-at", "2030-01-01T00:00:00Z",
               url=redis_url).returncode == 0
    assert r.hget(keys.config(), "partitions") == str(defaults.PARTITIONS).encode()


def test_the_cli_says_on_stderr_when_it_falls_back_to_the_default_url(tmp_path: Path) -> None:
    # A worker refused before it connects: whatever listens on the default port is left alone.
    res = cli("worker", "--app", "support.dashboard_app:app", "--concurrency", "0", cwd=tmp_path)
    assert res.returncode == 1 and "concurrency" in res.stderr, res
    assert "note: RSCHED_REDIS_URL is not set: using the default redis://127.0.0.1:6379/0" \
        in res.stderr


def test_the_cli_run_beside_rsched_dev_uses_the_url_it_left(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    data = tmp_path / defaults.DEV_DATA_DIR
    data.mkdir()
    (data / defaults.DEV_URL_FILE).write_text(redis_url + "\n")  # as rsched dev writes it
    r.hset(keys.config(), "partitions", 4)
    res = cli("status", "--json", cwd=tmp_path)
    assert res.returncode == 0, res
    assert f"note: using {redis_url}, the Redis of rsched dev" in res.stderr
    assert '"partition": 3' in res.stdout and '"partition": 4' not in res.stdout
    given = cli("status", cwd=tmp_path, url=redis_url)  # an explicit URL wins, silently
    assert given.returncode == 0 and "note:" not in given.stderr
