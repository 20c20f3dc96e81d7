"""A write applied on the primary that its replica did not confirm (WAIT fell short) says so, on
every face, and is never made twice by rsched's own retries: the Python client, `rsched jobs
add`, and the HTTP API (504 without Retry-After, the Idempotency-Key header).  A real primary
with a real replica, paused (SIGSTOP) to keep it from confirming; a TCP proxy to lose a reply
after the command ran."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.redis_server import RedisServer
from support.tcp_proxy import TcpProxy

from rsched.aclient import AsyncClient
from rsched.api.app import create_app
from rsched.client import Client
from rsched.core.errors import NotReplicated
from rsched.core.settings import Settings
from rsched.core.spec import JobSpec
from rsched.rdb import scripts

FAR = "2030-01-01T00:00:00Z"
WAIT_MS = 100  # how long a write waits for its replica here


@pytest.fixture(scope="module")
def primary(redis_available: None) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its replica, in sync, for this module."""
    with RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]) as main, \
            RedisServer(extra_args=["--replicaof", "127.0.0.1", str(main.port)]) as replica:
        deadline = time.monotonic() + 30
        with main.client() as r:
            while r.info("replication").get("connected_slaves") != 1:
                assert time.monotonic() < deadline, "the replica never connected"
                time.sleep(0.05)
        yield main, replica


@pytest.fixture()
def lagging(primary: tuple[RedisServer, RedisServer]) -> Iterator[RedisServer]:
    """The primary, flushed, while its replica confirms nothing."""
    main, replica = primary
    with main.client() as r:
        r.flushall()
        r.execute_command("WAIT", 1, 5000)  # the replica has the flush before it pauses
    replica.pause()
    try:
        yield main
    finally:
        replica.resume()


def waiting(url: str) -> Settings:
    return Settings(redis_url=url, wait_replicas=1, wait_timeout_ms=WAIT_MS)


def job_keys(r: redis.Redis) -> list[bytes]:
    return sorted(k for k in r.scan_iter("rsched:*:job:*", count=1000))


def test_a_schedule_its_replica_did_not_confirm_says_it_was_applied_and_names_the_job(
        lagging: RedisServer) -> None:
    with Client(settings=waiting(lagging.url)) as c, lagging.client() as r:
        with pytest.raises(NotReplicated) as e:
            c.schedule("t", run_at=FAR)
        assert e.value.job_id is not None
        assert str(e.value).startswith(
            f"job {e.value.job_id} applied, but not confirmed by 1 replica(s) within "
            f"{WAIT_MS} ms (0 confirmed)")
        assert "a retry is safe only with the same idempotency key" in str(e.value)
        assert c.get(e.value.job_id).id == e.value.job_id  # applied, as it says
        assert len(job_keys(r)) == 1
        # Each job of a batch gets its own error, naming it.
        many = c.schedule_many([JobSpec(type="t", run_at=FAR) for _ in range(3)])
        assert all(isinstance(x, NotReplicated) for x in many)
        assert len({x.job_id for x in many if isinstance(x, NotReplicated)}) == 3


def test_rsched_jobs_add_says_applied_not_confirmed_in_one_line(lagging: RedisServer) -> None:
    env = dict(os.environ, RSCHED_REDIS_URL=lagging.url, RSCHED_WAIT_REPLICAS="1",
               RSCHED_WAIT_TIMEOUT_MS=str(WAIT_MS), RSCHED_DEBUG="")
    res = subprocess.run([sys.executable, "-m", "rsched.cli", "jobs", "add", "--type", "t",
                          "--run-at", FAR], capture_output=True, text=True, timeout=60,
                         check=False, env=env)
    assert res.returncode == 1, res
    line = res.stderr.strip()
    assert line.startswith("error: job ") and "\n" not in line, res
    assert "applied, but not confirmed by 1 replica(s) within 100 ms" in line
    assert "safe only with the same idempotency key" in line
    with lagging.client() as r:
        (key,) = job_keys(r)
    assert key.decode().endswith(line.split()[2])  # the job it names is the one stored


def test_the_api_answers_an_unconfirmed_schedule_with_504_and_no_retry_after(
        primary: tuple[RedisServer, RedisServer]) -> None:
    main, replica = primary
    with main.client() as r:
        r.flushall()
    with TestClient(create_app(waiting(main.url), auth=False)) as api, main.client() as r:
        replica.pause()
        try:
            res = api.post("/jobs", json={"type": "t", "runAt": FAR},
                           headers={"Idempotency-Key": "order-1"})
        finally:
            replica.resume()
        assert res.status_code == 504, res.text
        assert "retry-after" not in res.headers
        body = res.json()
        assert body["type"] == "urn:rsched:problem:not-confirmed"
        assert "applied, but not confirmed by 1 replica(s)" in body["detail"]
        assert "same idempotency key" in body["detail"]
        (key,) = job_keys(r)
        # The retry with the same key, once the replica is back, finds the job: 200, not 201.
        r.execute_command("WAIT", 1, 5000)
        again = api.post("/jobs", json={"type": "t", "runAt": FAR},
                         headers={"Idempotency-Key": "order-1"})
        assert again.status_code == 200, again.text
        assert again.json()["idempotencyKey"] == "order-1"
        assert key.decode().endswith(again.json()["id"])
        assert job_keys(r) == [key]


def test_the_idempotency_key_header_keys_the_job_and_may_not_contradict_the_body(
        primary: tuple[RedisServer, RedisServer]) -> None:
    main, _ = primary
    with TestClient(create_app(Settings(redis_url=main.url), auth=False)) as api:
        made = api.post("/jobs", json={"type": "t", "runAt": FAR},
                        headers={"Idempotency-Key": "k-header"})
        assert made.status_code in (200, 201) and made.json()["idempotencyKey"] == "k-header"
        same = api.post("/jobs", json={"type": "t", "runAt": FAR, "idempotencyKey": "k-header"},
                        headers={"Idempotency-Key": "k-header"})
        assert same.status_code == 200 and same.json()["id"] == made.json()["id"]
        differ = api.post("/jobs", json={"type": "t", "runAt": FAR, "idempotencyKey": "k-body"},
                          headers={"Idempotency-Key": "k-header"})
        assert differ.status_code == 422, differ.text
        assert differ.json()["errors"][0]["field"] == "Idempotency-Key"
        batch = api.post("/jobs/batch", json={"jobs": [{"type": "t"}]},
                         headers={"Idempotency-Key": "k-batch"})
        assert batch.status_code == 422 and "idempotencyKey" in batch.json()["detail"]


# --- the client's own retries never make a second job ---------------------------------------


def lose_the_reply_once_applied(proxy: TcpProxy, r: redis.Redis) -> Callable[[], None]:
    """Hold every reply from the first script call on; once the job is stored, reset the
    connections (the reply is lost) and let replies through again."""
    r.script_load(scripts.load("schedule").source)  # the call runs: no NOSCRIPT reply held
    proxy.hold_replies_after(b"EVALSHA")

    def lose() -> None:
        deadline = time.monotonic() + 30
        while not job_keys(r):
            assert time.monotonic() < deadline, "the schedule never reached Redis"
            time.sleep(0.01)
        proxy.drop()
        proxy.release()

    return lose


def schedule_sync(url: str) -> Any:
    with Client(settings=Settings(redis_url=url)) as c:
        return c.schedule("t", run_at=FAR)


def schedule_async(url: str) -> Any:
    async def go() -> Any:
        c = AsyncClient(settings=Settings(redis_url=url))
        try:
            job, _ = await c.schedule_spec(JobSpec(type="t", run_at=FAR))
            return job
        finally:
            await c.close()

    return asyncio.run(go())


@pytest.mark.parametrize("schedule", [schedule_sync, schedule_async], ids=["sync", "asyncio"])
def test_a_schedule_whose_reply_was_lost_is_retried_into_the_same_job(
        redis_url: str, r: redis.Redis, schedule: Callable[[str], Any]) -> None:
    """The client sends the same job ids again (drawn once per call): the script finds the job
    it stored and the caller gets that one; nothing is stored twice."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with TcpProxy(port) as proxy:
        lose = threading.Thread(target=lose_the_reply_once_applied(proxy, r))
        lose.start()
        job = schedule(proxy.url)
        lose.join()
        assert proxy.accepted >= 2  # the reply was lost: the client connected again
    keys = job_keys(r)
    assert len(keys) == 1 and keys[0].decode().endswith(job.id)
