"""Every rsched command line of deploy/compose.yaml and deploy/kubernetes/, run as the recipe
gives it: `python -m rsched.cli` for the image's `rsched`, with the container's environment, in
a directory laid out as the image's working directory, against a Redis started with the compose
file's own redis-server arguments and the real Postgres.  Only what cannot be the same outside a
container changes: the Redis and archive URLs, and each served port (a free one in its place,
which the recipe's health checks then use).  Each process starts, passes the recipe's own
health checks, and stops on SIGTERM within the recipe's grace period; a job scheduled meanwhile
runs on the recipe's worker and reaches the archive.  Docker is not needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest
from support.archive import postgres_schema
from support.deploy import (
    ROOT,
    Check,
    ExecCheck,
    HttpCheck,
    Process,
    compose_checks,
    compose_service,
    dockerfile_stages,
    operator_commands,
    recipe_processes,
)
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched import Client
from rsched.core import defaults
from rsched.core.settings import Settings

pytestmark = pytest.mark.postgres

RECIPES = ("compose", "kubernetes")
# The settings that name a port a process serves: its variable and its flag.
PORT_SETTINGS = (("RSCHED_API_PORT", "--port"), ("RSCHED_METRICS_PORT", "--metrics-port"))
START_LINE = " started"  # "dispatcher ID started", "worker ID started: ...", "archiver ID ..."
START_TIMEOUT_S = 60  # four interpreters starting at once on a shared 2-core machine


@pytest.fixture(scope="module")
def recipe_redis(redis_available: None) -> Iterator[RedisServer]:
    """redis-server with the arguments of compose.yaml's redis service (AOF and noeviction)."""
    argv = compose_service("redis")["command"]
    assert argv[0] == "redis-server", argv
    with RedisServer(extra_args=argv[1:]) as server:
        yield server


def test_the_compose_redis_keeps_an_aof_fsynced_every_second_and_passes_its_health_check(
    recipe_redis: RedisServer,
) -> None:
    with recipe_redis.client(decode_responses=True) as r:
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
    [check] = compose_checks(compose_service("redis"))
    assert isinstance(check, ExecCheck) and check.argv[0] == "redis-cli", check
    program, *args = check.argv  # the test server's port in place of the default
    done = subprocess.run([program, "-p", str(recipe_redis.port), *args], capture_output=True,
                          text=True, timeout=15, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "PONG"), done.stderr


@pytest.fixture
def redis_url(recipe_redis: RedisServer) -> str:
    with recipe_redis.client() as r:
        r.flushall()
    return recipe_redis.url


@pytest.fixture
def archive_url(pg_dsn: str) -> Iterator[str]:
    """A Postgres schema of this test's own."""
    with postgres_schema(pg_dsn) as url:
        yield url


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The image's working directory: what the final stage of the Dockerfile copies into it from
    the build context (the bundled examples), linked from the source tree."""
    final = dockerfile_stages()[-1]
    assert final.all("WORKDIR"), "the image names its working directory"
    app = tmp_path / "app"
    app.mkdir()
    for copy in final.all("COPY"):
        *sources, dest = copy.split()
        if any(s.startswith("--from") for s in sources):
            continue
        assert not dest.startswith("/") and len(sources) == 1, copy
        (app / dest).symlink_to(ROOT / sources[0])
    return app


@dataclass
class Running:
    process: Process
    proc: Proc
    env: dict[str, str]
    ports: dict[int, int]  # the port the recipe serves on -> the port this run serves it on


def local_command(p: Process, redis_url: str, archive_url: str
                  ) -> tuple[list[str], dict[str, str], dict[int, int]]:
    """The process's arguments and environment here: the URLs and served ports replaced."""
    assert p.argv[0] == "rsched", f"{p.name}: runs {p.argv[0]}, not the image's rsched"
    args = list(p.argv[1:])
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSCHED_")}
    env.update(p.env, PYTHONUNBUFFERED="1")
    assert "RSCHED_REDIS_URL" in p.env, f"{p.name} is given no RSCHED_REDIS_URL"
    env["RSCHED_REDIS_URL"] = redis_url
    if "RSCHED_ARCHIVE_URL" in p.env:
        env["RSCHED_ARCHIVE_URL"] = archive_url
    assert [k for k, v in env.items() if "${" in v] == [], "left to Compose's interpolation"
    ports: dict[int, int] = {}

    def fresh(value: str) -> str:
        host, sep, port = value.rpartition(":")
        ports[int(port)] = free_port()
        return f"{host}{sep}{ports[int(port)]}"

    for variable, flag in PORT_SETTINGS:
        if variable in env:
            env[variable] = fresh(env[variable])
        for i, arg in enumerate(args):
            if arg == flag:
                args[i + 1] = fresh(args[i + 1])
            elif arg.startswith(flag + "="):
                args[i] = f"{flag}={fresh(arg.partition('=')[2])}"
    if p.command == "api" and "RSCHED_API_PORT" not in env and "--port" not in args:
        ports[defaults.API_PORT] = free_port()
        env["RSCHED_API_PORT"] = str(ports[defaults.API_PORT])
    return args, env, ports


def passes(check: Check, run: Running, cwd: Path) -> bool:
    """Whether the recipe's check succeeds now, run as Docker or the kubelet would."""
    if isinstance(check, HttpCheck):
        assert check.port in run.ports, (
            f"{run.process.name}: {check.kind} probe on port {check.port}, which it does not "
            f"serve (it serves {sorted(run.ports)})")
        try:
            res = httpx.get(f"http://127.0.0.1:{run.ports[check.port]}{check.path}",
                            headers=dict(check.headers), timeout=3)
        except httpx.TransportError:
            return False
        return 200 <= res.status_code < 400
    program, *rest = check.argv
    assert program in ("python", "rsched"), f"{run.process.name}: cannot run {program} here"
    argv = ([sys.executable, *rest] if program == "python"
            else [sys.executable, "-m", "rsched.cli", *rest])
    done = subprocess.run(argv, env=run.env, cwd=cwd, capture_output=True, timeout=15,
                          check=False)
    return done.returncode == 0


def started(r: Running, cwd: Path) -> bool:
    """The API: its checks pass (readiness among them); the others: the start line is logged,
    and then their checks pass."""
    if r.process.command != "api" and START_LINE not in r.proc.log.read_text(errors="replace"):
        return False
    return all(passes(c, r, cwd) for c in r.process.checks)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    out: list[Running] = []
    yield out
    for r in out:
        r.proc.stop()


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_process_of_the_recipe_starts_passes_its_checks_runs_a_job_and_stops_in_time(
    recipe: str, redis_url: str, archive_url: str, workdir: Path, running: list[Running]
) -> None:
    processes = recipe_processes(recipe)
    assert sorted(p.command for p in processes) == ["api", "archiver", "dispatcher", "worker"]
    for p in processes:
        args, env, ports = local_command(p, redis_url, archive_url)
        running.append(Running(p, Proc(p.command, args, env, workdir), env, ports))
    procs = [r.proc for r in running]
    # The key bootstrap the recipe's comments give, in the API's container (it needs only
    # Redis: it runs while the processes start).
    api = next(r for r in running if r.process.command == "api")
    [bootstrap] = operator_commands(recipe)
    assert (bootstrap.where, bootstrap.argv[0]) == (api.process.name.partition("/")[0], "rsched")
    key = subprocess.Popen([sys.executable, "-m", "rsched.cli", *bootstrap.argv[1:]],
                           env=api.env, cwd=workdir, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    for r in running:
        for port in r.process.ports:
            assert port in r.ports, f"{r.process.name} declares port {port} and serves none"
        assert r.process.checks, f"{r.process.name} has no health check"
        wait_for(f"{r.process.name} to start and pass its checks",
                 partial(started, r, workdir), procs, START_TIMEOUT_S)

    # With the key: a job the recipe's worker runs and its archiver archives.
    out, err = key.communicate(timeout=30)
    assert key.returncode == 0, err
    secret = out.strip()
    [port] = api.ports.values()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        assert http.get("/jobs").status_code == 401
        created = http.post("/jobs", json={"type": "hello", "payload": {"name": recipe}},
                            headers={"Authorization": f"Bearer {secret}"})
        assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    client = Client(settings=Settings.from_env(redis_url=redis_url))
    try:
        assert client.result(job_id, timeout=30) == {"greeting": f"hello, {recipe}"}
    finally:
        client.close()
    with psycopg.connect(archive_url, autocommit=True) as db:
        wait_for("the run's success in the archive", lambda: db.execute(
            "SELECT count(*) FROM events WHERE job_id = %s AND event = 'succeeded'",
            (job_id,)).fetchone() == (1,), procs)

    # SIGTERM to all at once, as `docker compose down` or a rollout sends it.
    t0 = time.monotonic()
    for r in running:
        r.proc.popen.send_signal(signal.SIGTERM)
    for r in running:
        try:
            code = r.proc.popen.wait(timeout=max(0.0, t0 + r.process.stop_grace_s
                                                 - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{r.process.name} still running {r.process.stop_grace_s} s after "
                        f"SIGTERM, when it would be killed\n{r.proc.tail()}")
        text = r.proc.log.read_text(errors="replace")
        assert code in (0, -signal.SIGTERM), f"{r.process.name} exited {code}\n{r.proc.tail()}"
        assert "Traceback" not in text, text
