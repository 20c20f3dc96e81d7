"""Per-key limits on a real 3-master Redis Cluster: a family's keys spread over partitions on
every master, each key's runs placed in its partition, so each check is one script on one slot;
a dispatcher's and a worker's real loops run them (async handlers that count their own overlap
per key), and no key ever runs more than its limit; a queue's limit, its permits on a slot of
their own, holds for its runs on every master; nothing is left in flight, and the walk of
the busy keys (lua/limit_keys.lua) reads each key's starts on its own master."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from support.helpers import keys_in_partition, run_engine
from support.redis_server import RedisCluster

from rsched import App, Client, JobContext, JobSpec
from rsched.core.models import Job
from rsched.core.settings import Settings
from rsched.rdb import keys
from rsched.rdb.limit_scripts import op_key_state

NO_WAIT: dict[str, object] = {"wait_replicas": 0}  # the test cluster has no replicas


@pytest.fixture()
def url(cluster: RedisCluster) -> str:
    cluster.flushall()
    return cluster.cluster_url


def test_each_key_of_a_family_is_limited_on_its_own_across_every_master(url: str) -> None:
    now_running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    done: list[str] = []
    app = App("limits-cluster")

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        key = ctx.payload["key"]
        now_running[key] += 1
        most[key] = max(most[key], now_running[key])
        await asyncio.sleep(0.05)
        now_running[key] -= 1
        done.append(ctx.run_id)

    # One key in each of partitions 0, 3, 5, 8 and 13: on all three masters (keys.tag).
    limited = [keys_in_partition(p, 1, f"tenant-{p}-")[0] for p in (0, 3, 5, 8, 13)]
    with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
        # A rate it never reaches keeps each key's starts in its window after the runs end.
        c.set_limit("tenant-*", concurrency=2, rate=(1000, 3600))
        specs = [JobSpec("t", {"key": k}, limit_key=k) for k in limited for _ in range(8)]
        jobs = c.schedule_many(specs)
        assert all(isinstance(j, Job) for j in jobs)
        asyncio.run(run_engine(url, app, lambda: len(done) >= len(specs), timeout_s=60,
                               settings_kw=NO_WAIT))
        left = [c.run(op_key_state(int(k.split("-")[1]), k, 0)) for k in limited]
        # The busy-key walk reads every partition on its master: each key's 8 starts.
        busiest = c.get_limit("tenant-*").busiest
    assert len(done) == len(set(done)) == len(specs)
    assert all(most[k] == 2 for k in limited), dict(most)  # each key on its own, at its limit
    assert all(state.in_flight == state.waiting == 0 for state in left), left
    assert sorted((b.key, b.in_flight, b.waiting, b.recent_starts) for b in busiest) == [
        (k, 0, 0, 8) for k in sorted(limited)]


def test_a_queue_limit_holds_across_every_master(url: str, cluster: RedisCluster) -> None:
    """The queue's permits on a slot of their own, its jobs in partitions on all three
    masters: the handlers never see more of the queue's runs at once than its limit."""
    running, most, done = [0], [0], list[str]()
    app = App("queue-limit-cluster")

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.05)
        running[0] -= 1
        done.append(ctx.run_id)

    with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
        c.set_queue_limit("default", concurrency=3)
        jobs = c.schedule_many([JobSpec("t", idempotency_key=f"spread-{i}") for i in range(40)])
        assert all(isinstance(j, Job) for j in jobs)
        parts = {j.id.split("-", 1)[0] for j in jobs if isinstance(j, Job)}
        asyncio.run(run_engine(url, app, lambda: len(done) >= len(jobs), timeout_s=60,
                               settings_kw=NO_WAIT))
        view = c.get_queue_limit("default")
    masters = {id(cluster.master_of_slot(keys.slot(keys.due(int(p))))) for p in parts}
    assert len(masters) == 3  # the queue's runs on every master
    assert most[0] == 3 and len(set(done)) == len(jobs)
    assert (view.in_flight, view.waiting) == (0, 0)
