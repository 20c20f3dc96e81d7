"""Dedup windows on a real 3-master Redis Cluster: creates of one dedup key from different
clients, at once, give one job; its record and its jobs share the key's slot."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from support.redis_server import RedisCluster

from rsched import AsyncClient, Client, Dedup, JobSpec
from rsched.core.ids import dedup_partition
from rsched.core.models import Job, partition_of
from rsched.core.settings import Settings
from rsched.rdb import keys

KEYS = [f"tenant-{n}" for n in range(8)]


@pytest.fixture()
def url(cluster: RedisCluster) -> str:
    cluster.flushall()
    return cluster.cluster_url


def _settings(url: str) -> Settings:
    return Settings(redis_url=url, wait_replicas=0)  # the test cluster has no replicas


def test_creates_of_one_dedup_key_from_different_clients_give_one_job(
    url: str, cluster: RedisCluster
) -> None:
    """Two sync clients in four threads and an async client send 8 keys' creates together,
    each mode once at least: per key, exactly one create made the job and every answer is it."""
    modes = ["ttl", "untilDone", "debounce"]
    windows = [Dedup(k, 60_000, modes[n % 3]) for n, k in enumerate(KEYS)]
    with Client(settings=_settings(url)) as a, Client(settings=_settings(url)) as b:
        def burst(client: Client, n: int) -> list[Job]:
            out = client.schedule_many([JobSpec("t", n, dedup=w) for w in windows])
            assert all(isinstance(j, Job) for j in out), out
            return out  # type: ignore[return-value]

        async def from_async() -> list[Job]:
            c = AsyncClient(settings=_settings(url))
            try:
                return list(await asyncio.gather(*(c.schedule("t", 99, dedup=w)
                                                   for w in windows)))
            finally:
                await c.close()

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(burst, client, n) for n, client in enumerate([a, b, a, b])]
            answers = [*(f.result() for f in futures), asyncio.run(from_async())]
        partitions = a.partitions
        for k, window in enumerate(windows):
            jobs = [answer[k] for answer in answers]
            assert len({j.id for j in jobs}) == 1, (window, jobs)
            assert sum(not j.deduplicated for j in jobs) == 1, window
            p = dedup_partition(window.key, partitions)
            assert partition_of(jobs[0].id) == p
            assert keys.slot(keys.dedup(p, window.key)) == keys.slot(keys.job(p, jobs[0].id))
    masters = set()  # the nodes that hold the keys' records: spread over the masters
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            for window in windows:
                slot = keys.slot(keys.dedup(dedup_partition(window.key, partitions), window.key))
                if r.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) > 0:
                    masters.add(node.port)
    assert len(masters) >= 2
