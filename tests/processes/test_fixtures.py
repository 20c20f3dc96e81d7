"""The test fixtures themselves: real servers that crash, pause and restart as the tests expect."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import psycopg
import pytest
import redis
from redis.sentinel import Sentinel
from support.helpers import Monitor
from support.redis_probe import command, replicating_from, role
from support.redis_sentinel import RedisSentinelGroup
from support.redis_server import RedisCluster, RedisServer, RedisServerError

ROOT = Path(__file__).resolve().parents[2]


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


def written_and_replicated(primary: RedisServer, key: str, value: str) -> None:
    """SET on `primary`, then WAIT until its replica acknowledged it (so a failover keeps it)."""
    with redis.Redis(port=primary.port, single_connection_client=True) as r:
        r.set(key, value)
        assert r.execute_command("WAIT", 1, 5000) == 1


def read_on_replica(replica: RedisServer, key: str) -> bytes | None:
    """GET on a cluster replica: READONLY lets it answer instead of redirecting to its master."""
    with redis.Redis(port=replica.port, single_connection_client=True) as r:
        r.execute_command("READONLY")
        value: bytes | None = r.get(key)
        return value


@pytest.mark.slow  # 3-5 s to start and sync 6 nodes
def test_a_cluster_with_replicas_has_three_masters_each_with_its_own_synced_replica(
    redis_cluster_replicas: RedisCluster,
) -> None:
    cluster = redis_cluster_replicas
    masters, replicas = cluster.masters(), cluster.replicas()
    assert len(masters) == 3 and len(replicas) == 3
    pairs = {master: cluster.replica_of(master) for master in masters}
    assert set(pairs.values()) == set(replicas)  # one replica each, none shared
    for master, replica in pairs.items():
        assert replicating_from(replica.port) == master.port
    assert {cluster.master_of_slot(slot) for slot in range(0, 16384, 256)} == set(masters)
    assert cluster.master_of_slot(16383) in masters
    # A write through a cluster client lands on the slot's master and reaches its replica.
    client = cluster.client()
    key = "fixture:{replicated}"
    client.set(key, "yes")
    master = cluster.master_of_slot(client.keyslot(key))
    assert master.client().get(key) == b"yes"
    written_and_replicated(master, key, "yes")
    assert read_on_replica(pairs[master], key) == b"yes"
    addresses = cluster.cluster_url.removeprefix("redis+cluster://").split(",")
    assert sorted(addresses) == sorted(f"127.0.0.1:{node.port}" for node in cluster.nodes)
    assert len(addresses) == 6


@pytest.mark.slow  # ~10 s: start 6 nodes, 2 s node timeout + election, rejoin
@pytest.mark.usefixtures("redis_available")
def test_a_killed_master_is_replaced_by_its_replica_and_rejoins_as_replica_when_restarted() -> None:
    with RedisCluster(replicas=1, node_timeout_ms=2000) as cluster:
        for node in cluster.nodes:
            assert command(node.port, "CONFIG", "GET", "cluster-node-timeout") == {
                "cluster-node-timeout": "2000"
            }
        slot = int(command(cluster.nodes[0].port, "CLUSTER", "KEYSLOT", "{kept}"))
        master = cluster.master_of_slot(slot)
        replica = cluster.replica_of(master)
        written_and_replicated(master, "{kept}", "yes")
        master.kill()
        killed_at = time.monotonic()
        # Bound: the 2 s node timeout, ~1 s of election delay, and 15 s for a shared machine.
        promoted = cluster.wait_failover(master, timeout_s=2 + 15)
        took = time.monotonic() - killed_at
        assert promoted is replica
        assert took >= 2.0  # no one may declare the master failed before the node timeout
        assert role(promoted.port) == "master"
        assert cluster.master_of_slot(slot) is promoted
        assert promoted.client().get("{kept}") == b"yes"
        master.restart()  # same port and nodes.conf: it comes back as the new master's replica
        cluster.wait_healthy()
        assert role(master.port) == "slave"
        assert cluster.replica_of(promoted) is master


def test_the_sentinel_group_names_its_primary_and_knows_replica_and_peers(
    redis_sentinel: RedisSentinelGroup,
) -> None:
    group = redis_sentinel
    primary = group.primary()
    replica = group.other(primary)
    assert replicating_from(replica.port) == primary.port
    assert group.url.startswith("redis+sentinel://") and group.url.endswith("/rsched")
    hosts = group.url.removeprefix("redis+sentinel://").removesuffix("/rsched").split(",")
    addresses = [(host, int(port)) for host, port in (h.split(":") for h in hosts)]
    assert sorted(port for _, port in addresses) == sorted(s.port for s in group.sentinels)
    for sentinel in group.sentinels:
        assert set(sentinel.instances("REPLICAS")) == {replica.port}
        assert set(sentinel.instances("SENTINELS")) == {
            s.port for s in group.sentinels if s is not sentinel
        }
    # redis-py's own Sentinel client, given only the URL's addresses, finds the same primary.
    sentinel_client = Sentinel(addresses, socket_timeout=2)
    try:
        assert sentinel_client.discover_master("rsched") == ("127.0.0.1", primary.port)
    finally:
        for conn in sentinel_client.sentinels:
            conn.close()


def test_sentinel_failover_makes_the_replica_primary_and_primary_follows(
    redis_sentinel: RedisSentinelGroup,
) -> None:
    group = redis_sentinel
    old = group.primary()
    written_and_replicated(old, "before", "failover")
    new = group.failover()
    assert new is group.other(old)
    assert group.primary() is new
    assert role(new.port) == "master"
    assert new.client().get("before") == b"failover"
    assert new.client().set("after", "failover")


@pytest.mark.slow  # ~5 s: start, 1 s down-after, vote and promotion
@pytest.mark.usefixtures("redis_available")
def test_a_primary_killed_with_sigkill_is_replaced_and_primary_follows() -> None:
    with RedisSentinelGroup(service="kill-test") as group:
        old = group.primary()
        written_and_replicated(old, "before", "kill")
        old.kill()
        # Bound: 1 s down-after, the vote and promotion, and 15 s for a shared machine.
        new = group.wait_new_primary(old, timeout_s=1 + 15)
        assert new is group.other(old)
        assert group.primary() is new
        assert role(new.port) == "master"
        assert new.client().get("before") == b"kill"
        assert group.url.endswith("/kill-test")


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
