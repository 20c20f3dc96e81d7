"""Shared fixtures: a real redis-server per session, a clean keyspace per test, a fresh Postgres DB.
Every folder under tests/ gets them; a test whose fixtures need more than its folder gives
(support.layout) stops the collection, naming the folder it belongs in.

A missing redis-server or PostgreSQL skips the tests that need it on a developer's machine and
fails the run under CI (env CI set), so a broken CI machine can never pass by skipping.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from psycopg import sql
from support.browser import chromium
from support.helpers import ManualClock, open_client, redis_now_ms
from support.layout import misplaced
from support.redis_sentinel import RedisSentinelGroup
from support.redis_server import RedisCluster, RedisServer
from support.services import missing_service

from rsched import Client

PG_ADMIN_DSN = os.environ.get(
    "RSCHED_TEST_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="session")
def redis_available() -> None:
    """For tests that start their own RedisServer or RedisCluster."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        missing_service(
            "redis-server not found on PATH: run `make redis` "
            "(Debian: apt-get install redis-server)"
        )


@pytest.fixture(scope="session")
def redis_server(redis_available: None) -> Iterator[RedisServer]:
    """One plain server for the session: no AOF, no RDB snapshots, noeviction."""
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server, emptied (keys and script cache) and running, for this test."""
    redis_server.resume()
    if not redis_server.is_running():
        redis_server.start()  # a test crashed it: same port, empty again
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
        client.script_flush()
    return redis_server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A bytes-in, bytes-out client on a clean keyspace."""
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def aof_redis(redis_available: None) -> Iterator[RedisServer]:
    """A fresh server of this test's own with appendonly yes, appendfsync everysec."""
    server = RedisServer(aof=True)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture()
def sink(redis_available: None) -> Iterator[RedisServer]:
    """A Redis of its own, outside the one a test fails over: what handlers log there stays."""
    s = RedisServer().start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for this module's browser tests (support.browser says how)."""
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def cluster(redis_available: None) -> Iterator[RedisCluster]:
    """3 masters, no replicas, for this module (tests share it: flush what you need empty)."""
    with RedisCluster() as c:
        yield c


@pytest.fixture(scope="module")
def redis_cluster_replicas(redis_available: None) -> Iterator[RedisCluster]:
    """3 masters + 3 replicas (one each, in sync), node timeout 5 s, for this module.

    Module scope: a start costs 3-5 s, and a module that kills or pauses nodes spoils only its
    own cluster. Tests in one module share it: call flushall() or use keys of your own."""
    with RedisCluster(replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def redis_sentinel(redis_available: None) -> Iterator[RedisSentinelGroup]:
    """A primary, its replica and 3 Sentinels (quorum 2, down-after 1 s), for this module.

    Module scope for the same reasons as redis_cluster_replicas; after a failover in one test
    the next one finds the other node primary: ask primary(), never assume nodes[0]."""
    with RedisSentinelGroup() as group:
        yield group


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A database `rsched_test_<random>` created for this session and dropped after it."""
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        missing_service(f"PostgreSQL not reachable at {PG_ADMIN_DSN}: {exc}".strip())
    name = f"rsched_test_{secrets.token_hex(4)}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(PG_ADMIN_DSN)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    """A Client on the clean keyspace (see helpers.settings), closed after the test."""
    yield from open_client(redis_url)


@pytest.fixture
def clock(r: redis.Redis) -> ManualClock:
    """Starts at Redis's time, so jobs the client schedules 'now' are due."""
    return ManualClock(redis_now_ms(r))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    errors = [f"{item.nodeid}: {why}" for item in items
              if (why := misplaced(item.path, getattr(item, "fixturenames", ()))) is not None]
    if errors:
        raise pytest.UsageError("tests in the wrong folder:\n" + "\n".join(errors))
