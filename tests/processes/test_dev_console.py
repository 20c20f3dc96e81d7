"""`rsched dev` stays out of the way (issue 15, items 7 and 8): its banner says where the admin
key is saved and how to run the CLI, the failures of the sample jobs that fail on purpose do not
scroll it away, and the CLI run in its directory finds its Redis.  A real `rsched dev` with its
own redis-server, in a temporary directory."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support.dev import interrupt, processes_mentioning, running
from support.processes import Proc, wait_for
from support.redis_server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


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


USER_APP = '''
from rsched import App

app = App("mine")


@app.job("mine.greet")
def greet(ctx):
    return {"hello": ctx.payload["name"]}
'''


def cli_here(here: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """An rsched command run in ``here`` as a user types it: no --redis-url, no URL variables."""
    return subprocess.run([sys.executable, "-m", "rsched.cli", *args], cwd=here, env=env,
                          capture_output=True, text=True, timeout=60)


def test_rsched_dev_serves_the_users_own_app_behind_a_password_in_private_files(
    redis_available: None, here: Path
) -> None:
    (here / "user_mod.py").write_text(USER_APP)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("RSCHED_REDIS_URL", "RSCHED_ARCHIVE_URL"):
        env.pop(name, None)
    proc = Proc("dev", ["dev", "--app", "user_mod:app", "--port", str(free_port()),
                        "--no-metrics-ports"], env, here)
    data = here / ".rsched"
    try:
        dev = running(proc)
        assert "worker      user_mod:app   (queues default)" in dev.banner
        assert "sample jobs" not in dev.banner  # the examples run only when asked
        assert dev.redis_url.startswith("redis://:***@127.0.0.1:"), dev.banner
        url = (data / "redis-url").read_text().strip()
        password = redis.Redis.from_url(url).connection_pool.connection_kwargs["password"]
        assert len(password) >= 24 and password not in proc.log.read_text()

        # The user's job runs on the worker rsched dev started; the CLI finds it all by itself.
        added = cli_here(here, env, "jobs", "add", "--type", "mine.greet", "--payload",
                         '{"name": "ada"}')
        assert added.returncode == 0, added
        job_id = added.stdout.strip()

        def status() -> str:
            shown = cli_here(here, env, "jobs", "show", job_id, "--json")
            assert shown.returncode == 0, shown
            return str(json.loads(shown.stdout)["status"])

        wait_for("the user's job completes", lambda: status() == "completed", [proc], 60)
        listed = cli_here(here, env, "jobs", "list", "--json")
        assert listed.returncode == 0, listed
        assert [j["type"] for j in json.loads(listed.stdout)["jobs"]] == ["mine.greet"]
        # rsched stats reads the archive of the rsched dev running here (no RSCHED_ARCHIVE_URL)
        def archived() -> list[str]:
            stats = cli_here(here, env, "stats", "durations", "--json")
            assert stats.returncode == 0, stats
            return [row["type"] for row in json.loads(stats.stdout)]

        wait_for("the run is archived", lambda: archived() == ["mine.greet"], [proc], 60)
        # Client() in the demo folder: the dev Redis and its archive, not 127.0.0.1:6379
        probe = ("from rsched import Client\n"
                 "c = Client()\n"
                 "print(c.archive_url, c.schedule('mine.greet', {'name': 'bob'}).id)")
        done = subprocess.run([sys.executable, "-c", probe], cwd=here, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done
        archive_url, other = done.stdout.split()
        assert archive_url == f"sqlite:///{data.resolve() / 'history.db'}"
        wait_for("Client()'s job completes", lambda: cli_here(
            here, env, "jobs", "show", other, "--json").stdout.count('"completed"'), [proc], 60)

        # Its Redis answers nobody without the password, and the password is on no command line.
        port = int((data / "redis.port").read_text())
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(128).startswith(b"-NOAUTH"), "the dev Redis answered without AUTH"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).get("rsched:config")
        assert redis.Redis.from_url(url).ping()
        assert processes_mentioning(password) == []

        # .rsched/ and everything in it is its owner's only: keys, URL, AOF, history, logs.
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        files = {p.relative_to(data).as_posix(): stat.S_IMODE(p.stat().st_mode)
                 for p in data.rglob("*")}
        for name in ("admin.key", "redis-url", "archive-url", "redis.conf", "history.db",
                     "logs/redis.log", "logs/worker.log"):
            assert files.get(name) == 0o600, (name, files)
        assert any(n.startswith("appendonlydir/") and n.endswith(".aof") for n in files)
        assert {n: m for n, m in files.items() if m & 0o077} == {}
        assert {n for n, m in files.items() if m == 0o700} == {"appendonlydir", "logs"}
    finally:
        assert interrupt(proc) == 0, proc.tail()
    assert not (data / "redis-url").exists() and not (data / "archive-url").exists()


def test_rsched_dev_refuses_a_bad_app_before_it_starts_anything(here: Path) -> None:
    (here / "user_mod.py").write_text(USER_APP)
    (here / "other_mod.py").write_text(USER_APP)  # the same job type in a second app
    env = dict(os.environ)
    for args, expected in [
        (["--app", "no_such_mod:app"], "Invalid value for --app: cannot import 'no_such_mod'"),
        (["--app", "user_mod:nothing"], "user_mod:nothing is not an rsched.App"),
        (["--app", "user_mod:app", "--app", "other_mod:app"],
         "job type 'mine.greet' has a handler in both user_mod:app and other_mod:app"),
    ]:
        res = cli_here(here, env, "dev", "--port", str(free_port()), *args)
        assert res.returncode == 2 and expected in res.stderr, (args, res)
        assert "Traceback" not in res.stderr
    assert not (here / ".rsched").exists()


def test_rsched_dev_closes_a_data_directory_an_earlier_version_left_open(
    redis_available: None, here: Path
) -> None:
    data = here / ".rsched"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "dev.lock").write_text("")
    (data / "admin.key").write_text("rsk_stale\n")
    for path in (data / "dev.lock", data / "admin.key"):
        path.chmod(0o644)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RSCHED_REDIS_URL", None)
    (here / "user_mod.py").write_text(USER_APP)
    proc = Proc("dev", ["dev", "--app", "user_mod:app", "--port", str(free_port()),
                        "--no-metrics-ports"], env, here)
    try:
        running(proc)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [data, *data.rglob("*")]}
        assert modes[".rsched"] == 0o700 and modes["dev.lock"] == modes["admin.key"] == 0o600
        assert {n: m for n, m in modes.items() if m & 0o077} == {}
    finally:
        assert interrupt(proc) == 0, proc.tail()


def test_rsched_dev_refuses_a_data_directory_of_someone_elses_open_to_others(
    here: Path
) -> None:
    shared = here / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    (shared / "notes.txt").write_text("mine\n")
    (here / "user_mod.py").write_text(USER_APP)
    res = cli_here(here, dict(os.environ), "dev", "--app", "user_mod:app", "--data-dir",
                   str(shared), "--port", str(free_port()))
    assert res.returncode == 1, res
    assert res.stderr.strip().splitlines() == [
        "error: --data-dir shared is open to other users (mode 0755) and holds files of its "
        "own: pass a new directory, or make it 0700"], res
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755 and sorted(shared.iterdir()) == [
        shared / "notes.txt"]
