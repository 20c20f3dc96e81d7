"""The test fixtures themselves: real servers that crash, pause and restart as the tests expect."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import psycopg
import pytest
import redis
from helpers import Monitor
from redis_server import RedisCluster, RedisServer, RedisServerError

ROOT = Path(__file__).resolve().parent.parent


def test_the_session_server_answers_and_keeps_nothing_on_disk(r: redis.Redis) -> None:
    assert r.ping()
    assert r.config_get("appendonly") == {"appendonly": "no"}
    assert r.config_get("save") == {"save": ""}
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


@pytest.mark.parametrize("turn", ["first", "second"])
def test_each_test_starts_with_an_empty_keyspace_and_script_cache(
    r: redis.Redis, turn: str
) -> None:
    assert r.dbsize() == 0
    sha = r.script_load("return 1")
    assert r.script_exists(sha) == [True]
    r.set(b"leftover", turn.encode())
    r.set(b"binary", b"\xff\x00")
    assert r.get(b"binary") == b"\xff\x00"


def test_monitor_gives_each_command_run_with_its_exact_arguments_and_a_scripts_own_commands(
    r: redis.Redis,
) -> None:
    awkward = b'a "quoted" \\ value\n\x00\xff\t'
    with Monitor(r) as mon:
        assert mon.commands() == []
        r.set(b"k{p1}", awkward)
        r.eval("redis.call('GET', KEYS[1]); return redis.pcall('TIME')", 1, "k{p1}")
        got = mon.commands()
        assert mon.commands() == []  # each call reads on from the last one's marker
    assert [c.args for c in got] == [
        [b"SET", b"k{p1}", awkward],
        [b"EVAL", b"redis.call('GET', KEYS[1]); return redis.pcall('TIME')", b"1", b"k{p1}"],
        [b"GET", b"k{p1}"],
        [b"TIME"],
    ]
    assert [c.client for c in got][2:] == ["lua", "lua"] and got[0].client != "lua"


def test_the_redis_url_names_the_session_server(redis_url: str, redis_server: RedisServer) -> None:
    assert redis_url == f"redis://127.0.0.1:{redis_server.port}/0"


def test_an_aof_server_keeps_a_key_across_a_clean_restart(aof_redis: RedisServer) -> None:
    aof_redis.client().set("job", "kept")
    port = aof_redis.port
    aof_redis.restart()
    assert aof_redis.port == port
    assert aof_redis.client().get("job") == b"kept"


def test_an_aof_server_keeps_acknowledged_writes_across_sigkill(aof_redis: RedisServer) -> None:
    client = aof_redis.client()
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.incrby("counter", 41)
    client.incr("counter")
    pid = aof_redis.pid
    aof_redis.kill()
    assert not aof_redis.is_running()
    aof_redis.restart()
    assert aof_redis.pid != pid
    assert aof_redis.client().get("counter") == b"42"


@pytest.mark.usefixtures("redis_available")
def test_a_server_without_aof_comes_back_empty_after_sigkill() -> None:
    with RedisServer() as server:
        server.client().set("lost", "yes")
        server.kill()
        server.start()
        assert server.client().dbsize() == 0


def test_a_paused_server_answers_nothing_until_resumed(aof_redis: RedisServer) -> None:
    client = aof_redis.client(socket_timeout=0.3)
    assert client.ping()
    aof_redis.pause()
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert time.monotonic() - started < 2
    aof_redis.resume()
    assert aof_redis.client(socket_timeout=2).ping()


@pytest.mark.usefixtures("redis_available")
def test_a_paused_server_still_stops_on_sigterm() -> None:
    server = RedisServer()
    try:
        server.start()
        server.pause()
        server.stop()
        assert not server.is_running()
    finally:
        server.close()


@pytest.mark.usefixtures("redis_available")
def test_a_server_that_cannot_start_reports_its_log() -> None:
    server = RedisServer(extra_args=["--no-such-directive", "1"])
    try:
        with pytest.raises(RedisServerError, match="no-such-directive"):
            server.start()
    finally:
        server.close()


@pytest.mark.slow  # 2-4.5 s: redis-cli --cluster create polls the join once a second
@pytest.mark.usefixtures("redis_available")
def test_a_cluster_of_three_masters_runs_a_hash_tagged_multi_key_script() -> None:
    with RedisCluster() as cluster:
        client = cluster.client()
        script = "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]); " \
            "return redis.call('MGET', KEYS[1], KEYS[2])"  # fmt: skip
        keys = ["rsched:{p7}:a", "rsched:{p7}:b"]
        assert client.eval(script, 2, *keys, "v") == [b"v", b"v"]
        owners = {client.get_node_from_key(key).name for key in keys}
        assert len(owners) == 1
        masters = {node.name for node in client.get_primaries()}
        assert len(masters) == 3
        # Without a shared tag the server itself refuses the script.
        with redis.Redis.from_url(cluster.url) as node:
            with pytest.raises(redis.ResponseError, match="same slot"):
                node.eval(script, 2, "rsched:{p1}:a", "rsched:{p2}:a", "v")


@pytest.mark.postgres
def test_pg_dsn_names_a_fresh_database_of_this_session(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("select current_database()").fetchone()
    assert row is not None
    assert row[0].startswith("rsched_test_")
    assert pg_dsn.endswith(f"/{row[0]}")


def test_pyproject_lists_every_rsched_subpackage() -> None:
    """`find` cannot map lua/ into rsched.lua, so packages are listed by hand: keep it whole."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "rsched").rglob("__init__.py")
    }
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"] == {"rsched.lua": "lua"}
    assert {"rsched.lua", "rsched.lua.include"} <= listed
