"""`rsched dev` as a user runs it: a private Redis with AOF, the API and dashboard, a dispatcher,
a worker with the example handlers and the archiver; the sample jobs run, retry and dead-letter;
Ctrl-C stops every process; a restart finds every job again."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.dev import interrupt, processes_mentioning, running
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched import Client
from rsched.core.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("redis_available")]

SAMPLE_KEYS = {"example-hello", "example-report-kolkata", "example-report-new-york",
               "example-flaky", "example-always-fails", "example-http-echo"}


def sample_key(key: str | None) -> str | None:
    """A sample's key, the HTTP target's without the port its key names."""
    return "example-http-echo" if key and key.startswith("example-http-echo-") else key




def start_dev(tmp: Path, name: str, *args: str) -> Proc:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RSCHED_REDIS_URL", None)
    return Proc(name, ["dev", *args], env, tmp)






def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False




def samples(http: httpx.Client) -> dict[str, dict[str, Any]]:
    jobs = http.get("/jobs", params={"limit": 100}).json()["jobs"]
    return {str(sample_key(j["idempotencyKey"])): j for j in jobs
            if sample_key(j["idempotencyKey"]) in SAMPLE_KEYS}


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "data"
    yield d
    for pid in processes_mentioning(str(d)):  # a failed test must not leave servers behind
        os.kill(pid, signal.SIGKILL)


def test_rsched_dev_runs_the_samples_stops_cleanly_and_a_restart_keeps_every_job(
    tmp_path: Path, data_dir: Path
) -> None:
    port = free_port()
    proc = start_dev(tmp_path, "dev1", "--port", str(port), "--data-dir", str(data_dir))
    http = httpx.Client()
    try:
        dev = running(proc)
        redis_port = int(dev.redis_url.rsplit(":", 1)[1].split("/")[0])
        assert "6 scheduled, 0 already there" in dev.banner
        assert f"{dev.base}/ui/#key={dev.key}" in dev.banner
        http = dev.http()
        jobs = samples(http)
        assert set(jobs) == SAMPLE_KEYS
        assert jobs["example-report-kolkata"]["timeZone"] == "Asia/Kolkata"
        assert http.get("/ui/").status_code == 200
        # The one-off runs at once; triggering the others shows a retry and a dead letter now.
        hello = jobs["example-hello"]["id"]
        wait_for("hello completes", lambda: http.get(f"/jobs/{hello}").json()["status"]
                 == "completed", [proc])
        flaky, doomed = jobs["example-flaky"]["id"], jobs["example-always-fails"]["id"]
        flaky_run = http.post(f"/jobs/{flaky}/trigger").json()["runId"]
        doomed_run = http.post(f"/jobs/{doomed}/trigger").json()["runId"]

        def attempts(job: str, run: str) -> list[tuple[int, str]]:
            runs = http.get(f"/jobs/{job}/runs").json()["runs"]
            return sorted((r["attempt"], r["status"]) for r in runs if r["runId"] == run)

        wait_for("flaky succeeds on its retry", lambda: attempts(flaky, flaky_run)
                 == [(1, "failed"), (2, "succeeded")], [proc])
        wait_for("the always-failing job is dead-lettered", lambda: any(
            d["runId"] == doomed_run for d in http.get("/dead-letters").json()["deadLetters"]),
            [proc])
        assert attempts(doomed, doomed_run) == [(1, "failed"), (2, "failed"), (3, "failed")]
        # The HTTP target sample calls the dev API's own /dev/echo, signed headers and all.
        echo = jobs["example-http-echo"]["id"]
        echo_run = http.post(f"/jobs/{echo}/trigger").json()["runId"]
        wait_for("the HTTP target sample succeeds", lambda: attempts(echo, echo_run)
                 == [(1, "succeeded")], [proc])
        [got] = [r["result"] for r in http.get(f"/jobs/{echo}/runs").json()["runs"]
                 if r["runId"] == echo_run]
        assert got["status"] == 200
        assert json.loads(got["body"])["rschedHeaders"]["rsched-run-id"] == echo_run
        # A sample that fails on purpose logs its dead letter with the run's ids, in the
        # worker's log only: the console keeps the banner in view.
        wait_for("the dead letter is in the worker's log", lambda: re.search(
            rf" ERROR .*dead-lettered.* run={re.escape(doomed_run)} attempt=3",
            (data_dir / "logs" / "worker.log").read_text()), [proc])
        assert doomed_run not in proc.log.read_text()
        # The archiver (SQLite) keeps up with the events.
        wait_for("the archive catches up", lambda: re.search(
            r"^rsched_archiver_lag_events\{partition=\"\d+\"\} [1-9]",
            http.get("/metrics").text, re.M) is None, [proc])
        assert (data_dir / "history.db").stat().st_size > 0
        # A second rsched dev on the same data refuses to start.
        other = start_dev(tmp_path, "dev2", "--port", str(free_port()), "--data-dir",
                          str(data_dir))
        assert other.popen.wait(30) == 1
        assert "another rsched dev is running" in other.log.read_text()
    finally:
        http.close()
        code = interrupt(proc)
    assert code == 0, proc.tail()
    assert re.search(r"\nstopped\n(\(\d+ warnings and errors of the sample jobs .*\)\n)?$",
                     proc.log.read_text())
    assert not answers(port) and not answers(redis_port)
    assert processes_mentioning(str(data_dir)) == []
    assert processes_mentioning(f"127.0.0.1:{redis_port}") == []

    proc = start_dev(tmp_path, "dev3", "--port", str(port), "--data-dir", str(data_dir))
    try:
        again = running(proc)
        assert "0 scheduled, 6 already there" in again.banner
        assert again.key == dev.key
        with again.http() as http:
            assert {k: j["id"] for k, j in samples(http).items()} == {
                k: j["id"] for k, j in jobs.items()}
            assert http.get(f"/jobs/{hello}").json()["status"] == "completed"
            dead = [d["runId"] for d in http.get("/dead-letters").json()["deadLetters"]]
            assert doomed_run in dead
    finally:
        assert interrupt(proc) == 0, proc.tail()


def test_rsched_dev_with_redis_url_uses_that_redis_and_starts_none(
    tmp_path: Path, data_dir: Path, redis_server: RedisServer
) -> None:
    redis_server.resume()
    client = Client(settings=Settings.from_env(redis_url=redis_server.url))
    client.r.flushall()
    proc = start_dev(tmp_path, "dev", "--port", str(free_port()), "--data-dir", str(data_dir),
                     "--redis-url", redis_server.url, "--no-metrics-ports")
    try:
        dev = running(proc)
        assert dev.redis_url == redis_server.url and "(external)" in dev.banner
        assert "metrics     " not in dev.banner
        with dev.http() as http:
            keys = {sample_key(client.get(j["id"]).idempotency_key)
                    for j in samples(http).values()}
        assert keys == SAMPLE_KEYS
        assert not (data_dir / "redis.conf").exists()
    finally:
        assert interrupt(proc) == 0, proc.tail()
        client.close()
    assert redis_server.client().ping()  # not ours to stop


def test_rsched_dev_refuses_a_port_in_use_with_one_line(tmp_path: Path, data_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = start_dev(tmp_path, "dev", "--port", str(port), "--data-dir", str(data_dir))
        started = time.monotonic()
        assert proc.popen.wait(30) == 1
    assert time.monotonic() - started < 30
    out = proc.log.read_text().strip().splitlines()
    assert out == [f"error: port {port} is in use: pass --port"], out
