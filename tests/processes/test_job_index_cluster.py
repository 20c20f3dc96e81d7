"""The job index on a Redis Cluster (3 masters): the archiver reads the jobs a batch names
across slots and masters, the one-time scan reads every master, and a filtered listing pages
through the index and reads the jobs back from the cluster."""

from __future__ import annotations

from pathlib import Path

import redis
from support.redis_server import RedisCluster

from rsched import Client
from rsched.archive import Archiver, ArchiverConfig, open_store
from rsched.core.settings import Settings
from rsched.rdb import keys
from rsched.rdb.connect import connect
from rsched.service.job_listing import JobFilter, op_job_listing

LATER_MS = 1_893_456_000_000


def test_the_job_index_is_kept_and_read_on_a_cluster(cluster: RedisCluster, tmp_path: Path
                                                      ) -> None:
    for node in cluster.nodes:  # the module's cluster, emptied
        with redis.Redis(port=node.port) as plain:
            plain.flushall()
    url = cluster.cluster_url
    store = open_store(f"sqlite:///{tmp_path}/archive.db")
    with Client(settings=Settings(redis_url=url, wait_replicas=0),
                archive_url=f"sqlite:///{tmp_path}/archive.db") as c, connect(url, wait=0) as r:
        ids = [c.schedule("rare" if i % 5 == 0 else "common", run_at=LATER_MS + i).id
               for i in range(60)]
        a = Archiver(r, store, c.partitions, ArchiverConfig(batch=20))
        a.setup()
        while a.run_once().read:
            pass
        walked, cursor = [], None
        while True:
            page = c.run(op_job_listing(c, JobFilter(type="rare"), sort="nextRun", limit=5,
                                        cursor=cursor))
            walked += [j.id for j in page.jobs]
            cursor = page.next_cursor
            if not cursor:
                break
        assert walked == [ids[i] for i in range(0, 60, 5)]
        # Jobs no event named (their events trimmed unread) come in with the scan of every
        # master's job keys.
        more = [c.schedule("late", run_at=LATER_MS).id for _ in range(9)]
        for p in range(c.partitions):
            r.delete(keys.events(p))
        for _ in range(200):
            a.index_once()
            if store.job_index_mark("scanned_ms") is not None:
                break
        page = c.run(op_job_listing(c, JobFilter(type="late"), limit=50))
        assert sorted(j.id for j in page.jobs) == sorted(more)
    store.close()
