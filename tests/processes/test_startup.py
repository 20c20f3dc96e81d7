"""Start-up while Redis is away: daemons wait for it, the API serves not-ready, the CLI fails fast.

The process tests start real `python -m rsched.cli ...` processes against a free port where no
Redis runs yet, then start redis-server on that very port.  Nothing sleeps a fixed time except
the check that a waiting daemon is still alive after 1.5 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from support.chaos_app import FINISHES
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched import Client
from rsched.archive.lag import archive_lag
from rsched.core.errors import UnsafeRedis
from rsched.core.settings import Settings
from rsched.engine import aio
from rsched.rdb import keys
from rsched.rdb.connect import connect_async
from rsched.rdb.setup import (
    StartupRetry,
    acheck_redis,
    is_unavailable,
    wait_for_redis,
)

TESTS = Path(__file__).resolve().parents[1]
PARTITIONS = 4
RETRY_LINE = "unreachable"
CLOSED = ("unable to perform operation on <TCPTransport closed=True reading=False "
          "0x7f3a5c0e1b20>; the handler is closed")


# --- classifying errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "unavailable"),
    [
        (RuntimeError(CLOSED), True),
        (RuntimeError("Event loop is closed"), False),
        (RuntimeError("dictionary changed size during iteration"), False),
        (RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), True),
        (RedisTimeoutError("Timeout reading from socket"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (AuthenticationError("invalid username-password pair"), False),
        (ResponseError("NOGROUP No such key"), False),
        (UnsafeRedis("Redis maxmemory-policy is allkeys-lru"), False),
        (ValueError("unable to perform operation on nothing"), False),
    ],
)
def test_is_unavailable_knows_uvloops_closed_transport_and_nothing_else_new(
    exc: BaseException, unavailable: bool
) -> None:
    assert is_unavailable(exc) is unavailable


def test_start_up_retries_wait_from_a_tenth_of_a_second_doubling_up_to_five() -> None:
    retry = StartupRetry("redis://:secret@db.example:6380/0")
    refused = RedisConnectionError("Connection refused")
    assert [retry.delay_s(refused) for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5, 5]
    assert retry.address == "db.example:6380"  # no password in log lines
    assert retry.delay_s(AuthenticationError("WRONGPASS")) is None


def test_wait_for_redis_retries_only_unavailability_logging_each_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)  # a CLI test before may have left the root at ERROR
    failures: list[BaseException] = [RedisConnectionError("Connection refused"),
                                     RuntimeError(CLOSED)]

    async def setup() -> None:
        if failures:
            raise failures.pop(0)

    async def refused() -> None:
        raise UnsafeRedis("Redis maxmemory-policy is allkeys-lru")

    async def main() -> bool:
        stop = asyncio.Event()
        ok = await wait_for_redis(setup, "redis://127.0.0.1:6390/0", stop)
        with pytest.raises(UnsafeRedis):
            await wait_for_redis(refused, "redis://127.0.0.1:6390/0", stop)
        return ok

    assert asyncio.run(main()) is True
    lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert [ln.rsplit(" ", 2)[-2] for ln in lines] == ["0.1", "0.2"], lines
    assert all(ln.startswith("Redis at 127.0.0.1:6390 unreachable (") for ln in lines)


def test_stop_ends_the_wait_for_redis_even_while_a_connection_attempt_hangs() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts nothing, answers nothing
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"

        async def main() -> tuple[bool, float]:
            r = connect_async(url)
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, stop.set)
            t0 = time.monotonic()
            try:
                ok = await wait_for_redis(lambda: acheck_redis(r), url, stop)
            finally:
                await r.aclose()
            return ok, time.monotonic() - t0

        ok, took_s = asyncio.run(main())
    assert ok is False and took_s < 2


def test_stop_does_not_wait_out_an_attempt_that_swallows_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection attempt deaf to its cancellation (as redis-py's once was, retrying for 21 s)
    holds a stop back by the grace period at most."""
    released = asyncio.Event()

    async def deaf_setup() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await released.wait()  # swallowed: ends only when the test lets it

    async def main() -> tuple[bool, float]:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        t0 = time.monotonic()
        ok = await wait_for_redis(deaf_setup, "redis://127.0.0.1:1/0", stop)
        took_s = time.monotonic() - t0
        released.set()
        await asyncio.sleep(0)
        return ok, took_s

    with caplog.at_level(logging.WARNING, logger="rsched"):
        ok, took_s = asyncio.run(main())
    assert ok is False and took_s < 3, took_s
    assert any("did not end when cancelled" in r.getMessage() for r in caplog.records)


def test_a_command_on_a_connection_the_network_dropped_is_retried_under_uvloop(
    redis_url: str,
) -> None:
    async def ping_after_drop(r: AsyncRedis) -> Any:
        await r.ping()
        conn = await r.connection_pool.get_connection()
        conn._writer.transport.abort()  # as after a reset: the pooled connection's transport
        await r.connection_pool.release(conn)  # is closed, redis-py does not know yet
        await asyncio.sleep(0.01)
        try:
            return await r.ping()
        except Exception as e:  # noqa: BLE001
            return e
        finally:
            await r.aclose()

    results: list[Any] = []

    async def main() -> None:
        results.append(await ping_after_drop(AsyncRedis.from_url(redis_url)))
        results.append(await ping_after_drop(connect_async(redis_url)))

    aio.run(main())
    plain, ours = results
    # redis-py before 8 raises uvloop's RuntimeError here, which rsched must take for a dropped
    # connection; 8.x notices the closed transport itself and reconnects.
    assert plain is True or (isinstance(plain, RuntimeError) and is_unavailable(plain)), plain
    assert ours is True  # rsched's client took it for a connection error and reconnected


# --- daemons started before Redis ----------------------------------------------------------------


def text(p: Proc) -> str:
    return p.log.read_text(errors="replace")


def still_waiting(procs: list[Proc], since: float) -> None:
    """Each process logged a retry line and is alive 1.5 s after ``since``."""
    wait_for("a retry line", lambda: all(RETRY_LINE in text(p) for p in procs), procs, 15)
    time.sleep(max(0.0, since + 1.5 - time.monotonic()))
    wait_for("nothing", lambda: True, procs)  # fails if one exited
    for p in procs:
        line = next(ln for ln in text(p).splitlines() if RETRY_LINE in ln)
        assert "Redis at 127.0.0.1:" in line and "retrying in" in line, line


def exit_code(p: Proc) -> int:
    """SIGTERM it and wait (support.processes.Proc.stop kills it after 15 s)."""
    p.stop()
    assert "Traceback" not in text(p), text(p)
    return p.popen.returncode


def schedule_one(redis_url: str) -> None:
    client = Client(settings=Settings.from_env(redis_url=redis_url, partitions=PARTITIONS))
    try:
        client.schedule("record", {}, run_at=0)
    finally:
        client.close()


@pytest.fixture
def dead_port(redis_available: None) -> Iterator[tuple[int, dict[str, str]]]:
    """A free port with no Redis yet, and the environment pointing processes at it."""
    port = free_port()
    env = dict(os.environ, RSCHED_REDIS_URL=f"redis://127.0.0.1:{port}/0",
               RSCHED_PARTITIONS=str(PARTITIONS), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    yield port, env


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()


def test_a_dispatcher_and_worker_started_before_redis_wait_for_it_then_run_a_job(
    dead_port: tuple[int, dict[str, str]], procs: list[Proc], tmp_path: Path
) -> None:
    port, env = dead_port
    t0 = time.monotonic()
    procs += [
        Proc("dispatcher", ["--allow-unsafe-redis", "dispatcher", "--max-sleep-ms", "200"],
             env, tmp_path),
        Proc("worker", ["--allow-unsafe-redis", "worker", "--app", "support.chaos_app:app",
                        "--heartbeat-ms", "500"], env, tmp_path),
    ]
    still_waiting(procs, t0)
    with RedisServer(port=port) as server:
        r = server.client()
        wait_for("the dispatcher to take every partition",
                 lambda: all(r.hget(keys.lease(p), "owner") for p in range(PARTITIONS)), procs)
        schedule_one(server.url)
        wait_for("the job to run", lambda: r.hlen(FINISHES) == 1, procs)
        assert [exit_code(p) for p in procs] == [0, 0]


def test_an_archiver_started_before_redis_waits_for_it_then_archives(
    dead_port: tuple[int, dict[str, str]], procs: list[Proc], tmp_path: Path
) -> None:
    port, env = dead_port
    t0 = time.monotonic()
    procs.append(Proc("archiver", ["--allow-unsafe-redis", "archiver", "--archive-url",
                                   f"sqlite:///{tmp_path / 'archive.db'}", "--poll-ms", "50"],
                      env, tmp_path))
    still_waiting(procs, t0)
    with RedisServer(port=port) as server:
        r = server.client()
        schedule_one(server.url)  # its 'scheduled' event waits in Redis until archived
        wait_for("the event to be archived",
                 lambda: archive_lag(r, PARTITIONS).entries == 0, procs)
        assert exit_code(procs[0]) == 0


def test_the_api_serves_at_once_not_ready_until_redis_is_up(
    dead_port: tuple[int, dict[str, str]], procs: list[Proc], tmp_path: Path
) -> None:
    port, env = dead_port
    api_port = free_port()
    t0 = time.monotonic()
    procs.append(Proc("api", ["--allow-unsafe-redis", "api", "--port", str(api_port),
                              "--no-auth"], env, tmp_path))
    with httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=5) as http:
        assert wait_for("/healthz", lambda: http.get("/healthz").status_code == 200, procs)
        not_ready = http.get("/readyz")
        assert not_ready.status_code == 503
        assert not_ready.headers["content-type"].startswith("application/problem+json")
        assert "Redis is unreachable" in not_ready.json()["detail"]
        still_waiting(procs, t0)
        with RedisServer(port=port):
            wait_for("/readyz", lambda: http.get("/readyz").status_code == 200, procs)
            assert http.get("/healthz").status_code == 200
            assert exit_code(procs[0]) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM


@pytest.mark.parametrize("command", [
    ["dispatcher"],
    ["worker", "--app", "support.chaos_app:app"],
    ["archiver", "--archive-url", "sqlite:///{tmp}/archive.db"],
])
def test_sigterm_stops_a_daemon_still_waiting_for_redis(
    dead_port: tuple[int, dict[str, str]], procs: list[Proc], tmp_path: Path, command: list[str]
) -> None:
    _, env = dead_port
    args = [a.format(tmp=tmp_path) for a in command]
    procs.append(Proc(args[0], args, env, tmp_path))
    wait_for("a retry line", lambda: RETRY_LINE in text(procs[0]), procs, 15)
    t0 = time.monotonic()
    assert exit_code(procs[0]) == 0
    assert time.monotonic() - t0 < 5


# --- refusals still fail fast ------------------------------------------------------------------


def run_cli(redis_url: str, *args: str,
            timeout_s: float = 15) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rsched.cli", *args], env=env, cwd=TESTS,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    return done, time.monotonic() - t0


def assert_one_line(done: subprocess.CompletedProcess[str], start: str) -> None:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def password_redis(redis_available: None) -> Iterator[RedisServer]:
    """A server of this module's own that wants the password 'secret'."""
    with RedisServer() as server:
        server.client().config_set("requirepass", "secret")
        yield server


@pytest.mark.parametrize("password", ["", ":wrong@"])
@pytest.mark.parametrize("command", [["dispatcher"], ["worker", "--app", "support.chaos_app:app"]])
def test_a_missing_or_wrong_password_is_not_waited_for(
    password_redis: RedisServer, command: list[str], password: str
) -> None:
    url = password_redis.url.replace("redis://", f"redis://{password}")
    done, took_s = run_cli(url, "--allow-unsafe-redis", *command)
    assert_one_line(done, "error: Redis: ")
    assert took_s < 10


def test_an_evicting_redis_is_refused_at_once_by_a_dispatcher(
    redis_url: str, r: redis.Redis
) -> None:
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        done, took_s = run_cli(redis_url, "dispatcher")
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    assert_one_line(done, "error: Redis maxmemory-policy is allkeys-lru")
    assert took_s < 10


@pytest.mark.parametrize("command", [["status"], ["doctor"], ["jobs", "list"], ["dlq", "list"]])
def test_cli_commands_against_a_dead_port_fail_fast_with_one_line(command: list[str]) -> None:
    done, took_s = run_cli(f"redis://127.0.0.1:{free_port()}/0", *command)
    assert_one_line(done, "error: cannot reach Redis: ")
    assert took_s < 5


# --- an outage's end is logged ------------------------------------------------------------------

BACK_LINE = "redis reachable again after"


def test_every_daemon_logs_when_redis_comes_back_and_how_long_it_was_away(
    dead_port: tuple[int, dict[str, str]], procs: list[Proc], tmp_path: Path
) -> None:
    port, env = dead_port
    api_port = free_port()
    procs += [
        Proc("dispatcher", ["--allow-unsafe-redis", "dispatcher", "--max-sleep-ms", "200"],
             env, tmp_path),
        Proc("worker", ["--allow-unsafe-redis", "worker", "--app", "support.chaos_app:app",
                        "--heartbeat-ms", "300"], env, tmp_path),
        Proc("archiver", ["--allow-unsafe-redis", "archiver", "--archive-url",
                          f"sqlite:///{tmp_path / 'archive.db'}", "--poll-ms", "50"],
             env, tmp_path),
        Proc("api", ["--allow-unsafe-redis", "api", "--port", str(api_port), "--no-auth"],
             env, tmp_path),
    ]
    with RedisServer(port=port, aof=True) as server, \
            httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=5) as http:
        r = server.client()
        wait_for("the dispatcher to take every partition",
                 lambda: all(r.hget(keys.lease(p), "owner") for p in range(PARTITIONS)), procs)
        wait_for("the API", lambda: http.get("/jobs").status_code == 200, procs)
        # Up, not still in their start-up wait (a slow start on a busy machine): an outage then
        # is the start-up's retry, not one of a running daemon.
        wait_for("each daemon to start", lambda: all(
            " started" in text(p) for p in procs[:3]), procs, 60)
        server.stop()
        away = time.monotonic()
        wait_for("every daemon to notice", lambda: all(
            "Connection refused" in text(p) for p in procs[:3]), procs, 30)
        assert http.get("/jobs").status_code == 503
        time.sleep(max(0.0, away + 3.0 - time.monotonic()))  # away at least 3 s
        server.start()
        wait_for("the API again", lambda: http.get("/jobs").status_code == 200, procs, 30)
        wait_for("each to log Redis back", lambda: all(BACK_LINE in text(p) for p in procs),
                 procs, 30)
        for p in procs:
            lines = [ln for ln in text(p).splitlines() if BACK_LINE in ln]
            assert len(lines) == 1, (p, lines)
            seconds = float(lines[0].split(BACK_LINE)[1].split()[0])
            assert seconds >= 1.0, lines  # the outage (from its first failure), not one wait
