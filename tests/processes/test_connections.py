"""Connection pools: every client rsched makes serves more concurrent commands than redis-py's
own default pool size (100 since redis-py 8), on one Redis and on a cluster's nodes.

Each command is a BLPOP that holds its connection for a while, so N of them at once need N
connections; a pool capped below N fails the extra ones with MaxConnectionsError.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.redis_server import RedisCluster

from rsched.core import defaults
from rsched.rdb.connect import connect, connect_async

CONCURRENT = 150  # above redis-py 8's default of 100
HOLD_S = 0.5  # each BLPOP holds its connection this long


def blpop_many_sync(r: Any, key: str) -> list[Any]:
    with ThreadPoolExecutor(CONCURRENT) as pool:
        return list(pool.map(lambda _: r.blpop([key], HOLD_S), range(CONCURRENT)))


async def blpop_many_async(r: Any, key: str) -> list[Any]:
    try:
        return await asyncio.gather(*(r.blpop([key], HOLD_S) for _ in range(CONCURRENT)),
                                    return_exceptions=True)
    finally:
        await r.aclose()


def test_the_default_pool_size_is_above_redis_pys_own() -> None:
    assert defaults.REDIS_MAX_CONNECTIONS > CONCURRENT


def test_a_sync_client_serves_150_threads_at_once(redis_url: str) -> None:
    r = connect(redis_url)
    try:
        assert blpop_many_sync(r, "nothing") == [None] * CONCURRENT
    finally:
        r.close()


def test_an_asyncio_client_serves_150_commands_at_once(redis_url: str) -> None:
    assert asyncio.run(blpop_many_async(connect_async(redis_url), "nothing")) == [None] * CONCURRENT


def test_a_url_option_sets_the_pool_size(redis_url: str) -> None:
    r = connect(f"{redis_url}?max_connections=7")
    try:
        assert r.connection_pool.max_connections == 7
    finally:
        r.close()


@pytest.mark.slow
def test_a_cluster_clients_node_pools_serve_150_commands_at_once(cluster: RedisCluster) -> None:
    key = "{p0}:nothing"  # every command goes to the node that owns this slot
    sync = connect(cluster.cluster_url, wait=0)
    try:
        assert blpop_many_sync(sync, key) == [None] * CONCURRENT
    finally:
        sync.close()
    replies = asyncio.run(blpop_many_async(connect_async(cluster.cluster_url, wait=0), key))
    assert replies == [None] * CONCURRENT


def test_a_sentinel_clients_pool_has_the_same_size() -> None:
    url = "redis+sentinel://127.0.0.1:1/mymaster"  # nothing connects until a command
    sync, async_ = connect(url), connect_async(url)
    assert sync.connection_pool.max_connections == defaults.REDIS_MAX_CONNECTIONS
    assert async_.connection_pool.max_connections == defaults.REDIS_MAX_CONNECTIONS
