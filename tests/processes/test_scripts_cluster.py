"""The Lua scripts on a real 3-master Redis Cluster: a script may touch only keys of its own
slot, and every script runs with each call routed by its first key (the scenario of
tests/redis/test_scripts.py, support.scripts.exercise_every_script, watched on every node)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio.cluster as aiocluster
from redis.exceptions import ResponseError
from support.helpers import (
    ManualClock,
    Monitor,
)
from support.redis_server import RedisCluster
from support.scripts import (
    PA,
    PB,
    exercise_every_script,
    scripts_run,
)

from rsched import Client
from rsched.core.settings import Settings
from rsched.rdb import keys, scripts


class OneByOne:
    """A pipeline for a redis-py cluster client that sends each queued command on its own, routed
    by the client (a script call by its first key).  redis-py's ClusterPipeline refuses EVALSHA,
    TIME and PUBLISH, which rsched's pipelines use: rsched has no cluster code path yet, and this
    test is about what the scripts touch, so it trades the round trips away."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queued: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., OneByOne]:
        def queue(*args: Any, **kwargs: Any) -> OneByOne:
            self._queued.append((name, args, kwargs))
            return self

        return queue

    def _take(self) -> list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
        queued, self._queued = self._queued, []
        return [(getattr(self._client, name), args, kwargs) for name, args, kwargs in queued]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        out: list[Any] = []
        for fn, args, kwargs in self._take():
            try:
                out.append(fn(*args, **kwargs))
            except ResponseError as e:
                if raise_on_error:
                    raise
                out.append(e)
        return out


class AsyncOneByOne(OneByOne):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:  # type: ignore[override]
        out: list[Any] = []
        for fn, args, kwargs in self._take():
            try:
                out.append(await fn(*args, **kwargs))
            except ResponseError as e:
                if raise_on_error:
                    raise
                out.append(e)
        return out


class OneByOneClient:
    """A cluster client whose pipelines are OneByOne; everything else is the client's own."""

    def __init__(self, client: Any, pipeline: type[OneByOne]) -> None:
        self._client = client
        self._pipeline = pipeline

    def pipeline(self, transaction: bool = False) -> OneByOne:
        assert not transaction
        return self._pipeline(self._client)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_the_cluster_rejects_a_script_that_touches_a_key_of_another_slot(
    cluster: RedisCluster,
) -> None:
    rc = cluster.client()
    assert rc.get_node_from_key(keys.due(PA)) != rc.get_node_from_key(keys.due(PB))
    sneaky = f"return redis.call('HGET', '{keys.job(PB, 'x')}', 'a')"
    with pytest.raises(ResponseError, match="(?i)slot|non local key"):
        rc.eval(sneaky, 1, keys.job(PA, "x"))


def test_every_script_runs_on_a_redis_cluster_with_each_call_routed_by_its_first_key(
    cluster: RedisCluster,
) -> None:
    rc = cluster.client()
    rc.flushall()
    nodes = {rc.get_node_from_key(keys.due(p)).name for p in (PA, PB)}
    assert len(nodes) == 2, "the scenario's partitions should live on different masters"
    client = Client(settings=Settings(redis_url=cluster.url),
                    redis=OneByOneClient(rc, OneByOne))  # type: ignore[arg-type]

    async def run() -> None:
        ar = aiocluster.RedisCluster(startup_nodes=[
            aiocluster.ClusterNode(n.host, n.port) for n in cluster.startup_nodes])
        try:
            sec, usec = await ar.time()
            await exercise_every_script(client, OneByOneClient(ar, AsyncOneByOne),
                                        ManualClock(sec * 1000 + usec // 1000))
        finally:
            await ar.aclose()

    with contextlib.ExitStack() as stack:
        monitors = [stack.enter_context(Monitor(stack.enter_context(node.client())))
                    for node in cluster.nodes]
        asyncio.run(run())
        ran = set().union(*(scripts_run(m.commands()) for m in monitors))
    assert ran == set(scripts.NAMES)
