"""What redis-py's own cluster client does where rsched routes Redis Cluster itself
(docs/design/cluster-router.md): each test asserts the stock client's behaviour as it is in the
redis-py version the note names, beside the router's, so an upgrade that changes it fails here
and the decision is checked again."""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster as StockCluster
from support.redis_server import RedisCluster
from support.tcp_proxy import TcpProxy, proxies_for

from rsched.core.errors import NotReplicated
from rsched.rdb.cluster import ClusterRedis
from rsched.rdb.connect import connect
from rsched.rdb.durable import Wait

ROOT = Path(__file__).resolve().parents[2]
NOTE = ROOT / "docs" / "design" / "cluster-router.md"
HOST = "127.0.0.1"


def test_the_design_note_was_checked_against_the_newest_redis_py_allowed() -> None:
    """Raising redis-py's ceiling in pyproject.toml means checking the note's reasons against
    the new version first (its "Re-checking" section), then naming that version in it."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("redis"))
    ceiling = re.search(r"<(\d+)\.(\d+)", spec)
    assert ceiling, spec
    major, minor = int(ceiling[1]), int(ceiling[2]) - 1
    assert f"redis-py {major}.{minor}" in NOTE.read_text(), (
        f"pyproject allows redis-py up to {major}.{minor}: re-check {NOTE.name} against it")


def _calls(port: int, command: str) -> int:
    with redis.Redis(port=port) as r:
        stat = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stat["calls"]) if stat else 0


def _one_key_per_master(rc: ClusterRedis) -> dict[tuple[str, int], str]:
    keys: dict[tuple[str, int], str] = {}
    for i in range(1000):
        keys.setdefault(rc.slots.node_for(("SET", f"k{i}")), f"k{i}")
    assert len(keys) == len(rc.slots.masters)
    return keys


def test_wait_in_a_stock_pipeline_is_not_one_per_master_that_wrote(
        redis_cluster_replicas: RedisCluster) -> None:
    """rsched ends each master's part of a durable pipeline with WAIT on the connection that
    wrote it, and judges each master's writes by its own WAIT.  The stock pipeline sends WAIT
    to one node, or (target_nodes=PRIMARIES) to every master with the replies summed into one
    number, which cannot say whose replica fell short."""
    c = redis_cluster_replicas
    with connect(c.cluster_url) as rc:
        rc.ready()
        keys = _one_key_per_master(rc)
        masters = [m for m in c.masters() if (HOST, m.port) in keys]
        stock = StockCluster(startup_nodes=c.startup_nodes)
        try:
            before = {m.port: _calls(m.port, "wait") for m in masters}
            pipe: Any = stock.pipeline()
            for k in keys.values():
                pipe.set(k, "v")
            pipe.wait(1, 1000)
            assert len(pipe.execute()) == len(keys) + 1
            assert sorted(_calls(m.port, "wait") - before[m.port] for m in masters) == [0, 0, 1]

            lagging = masters[0]
            replica = c.replica_of(lagging)
            replica.pause()
            try:
                pipe = stock.pipeline()
                for k in keys.values():
                    pipe.set(k, "v")
                pipe.execute_command("WAIT", 1, 300, target_nodes=StockCluster.PRIMARIES)
                *writes, waited = pipe.execute()
                ours: Any = rc.pipeline()
                ours.confirm_each = Wait(1, 300)
                for k in keys.values():
                    ours.set(k, "v")
                judged = ours.execute(raise_on_error=False)
            finally:
                replica.resume()
            assert writes == [True] * len(keys)
            assert waited == len(masters) - 1  # one number for all masters: whose is short?
            for (addr, _), res in zip(keys.items(), judged, strict=True):
                if addr == (HOST, lagging.port):
                    assert isinstance(res, NotReplicated), res
                else:
                    assert res is True, (addr, res)
        finally:
            stock.close()


@pytest.fixture()
def proxied(cluster: RedisCluster) -> Iterator[tuple[RedisCluster, dict[int, TcpProxy]]]:
    """The cluster's nodes each behind a TcpProxy: freezing one stalls a master for the
    clients only, while the cluster itself still sees it healthy."""
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            r.flushall()
    with proxies_for(n.port for n in cluster.nodes) as proxies:
        yield cluster, proxies


@pytest.mark.slow
def test_a_stalled_master_fails_a_stock_pipeline_for_the_live_masters_too(
        proxied: tuple[RedisCluster, dict[int, TcpProxy]]) -> None:
    """Once the stock client must open a connection to a master that does not answer, its
    pipeline raises for the whole batch and sends nothing to the live masters.  The router
    fails only that master's commands."""
    cluster, proxies = proxied
    pairs = {(HOST, port): (HOST, p.port) for port, p in proxies.items()}
    remap = ",".join(f"{HOST}:{a[1]}={HOST}:{b[1]}" for a, b in pairs.items())
    seed = proxies[cluster.nodes[0].port]
    stalled = proxies[cluster.nodes[2].port]
    timeouts: dict[str, Any] = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
    with connect(f"redis+cluster://{HOST}:{seed.port}?address_remap={remap}",
                 **timeouts) as rc:
        rc.ready()
        keys = _one_key_per_master(rc)
        stock = StockCluster(host=HOST, port=seed.port, address_remap=lambda a: pairs.get(a, a),
                             **timeouts)
        try:
            stock.ping()  # the slot map is read now, while every master answers
            stalled.freeze()
            try:
                pipe: Any = stock.pipeline()
                for k in keys.values():
                    pipe.set(k, "stock")
                with pytest.raises((redis.exceptions.TimeoutError,
                                    redis.exceptions.ConnectionError)):
                    pipe.execute(raise_on_error=False)
                for port in proxies:  # nothing was sent to the live masters either
                    with redis.Redis(port=port) as node:
                        assert node.dbsize() == 0
                t0 = time.monotonic()
                ours: Any = rc.pipeline()
                for k in keys.values():
                    ours.set(k, "ours")
                res = ours.execute(raise_on_error=False)
                took = time.monotonic() - t0
            finally:
                stalled.thaw()
        finally:
            stock.close()
        for (addr, k), r in zip(keys.items(), res, strict=True):
            with redis.Redis(port=next(n for n, p in proxies.items() if p.port == addr[1])
                             ) as node:
                if addr[1] == stalled.port:
                    assert isinstance(r, (redis.exceptions.TimeoutError,
                                          redis.exceptions.ConnectionError)), r
                else:
                    assert r is True
                    assert node.get(k) == b"ours"
        assert took < 15, took  # its own timeouts and one resend, not a wait per command
