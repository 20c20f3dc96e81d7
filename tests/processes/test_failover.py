"""Failover with real processes: a cluster master killed under steady load (its replica lagging),
and a Sentinel failover.  What must hold (docs/guarantees.md, docs/redis.md):

- nothing acknowledged is lost: with the durability setting (WAIT for one replica, the default
  for cluster and Sentinel URLs) a write the replica does not have is never acknowledged;
- every acknowledged job runs, duplicates only ever share the run id of their original;
- partitions on healthy masters keep their start lag; no rsched process exits.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from support.chaos_app import STARTS
from support.fleet import Fleet, counts, started, wait_for
from support.redis_probe import command
from support.redis_sentinel import RedisSentinelGroup
from support.redis_server import RedisCluster, RedisServer

from rsched import Client, Job, JobSpec
from rsched.archive.archiver import Archiver
from rsched.archive.config import ArchiverConfig
from rsched.archive.stores import open_store
from rsched.core.errors import RschedError
from rsched.core.models import partition_of
from rsched.core.settings import Settings
from rsched.rdb import keys
from rsched.rdb.connect import connect

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

NODE_TIMEOUT_MS = 2000
LEASE_MS = 2000


class Load:
    """Schedules a batch of jobs due now every 50 ms in a thread; keeps what was acknowledged."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.acked: dict[str, int] = {}  # run id -> partition
        self.refused: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            specs = [JobSpec(type="record") for _ in range(20)]
            try:
                jobs = self.client.schedule_many(specs)
            except (RschedError, redis.RedisError, OSError) as e:
                self.refused[type(e).__name__] += 1
                time.sleep(0.05)
                continue
            for j in jobs:
                if isinstance(j, Job) and j.next_ms is not None:
                    self.acked[f"{j.id}@{j.next_ms}"] = partition_of(j.id)
                elif isinstance(j, Exception):
                    self.refused[type(j).__name__] += 1
            time.sleep(0.05)


class Counter(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return 0


def start_lag_ms(client: Client, run_ids: list[str]) -> list[int]:
    runs = client.run(client.op_read_runs(run_ids))
    return [r.started_ms - r.sched_ms for r in runs if r is not None and r.started_ms]


def p99(xs: list[int]) -> int:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0


def run_fleet(url: str, sink: RedisServer, tmp_path: Path) -> Fleet:
    fleet = Fleet(url, tmp_path)
    fleet.env["CHAOS_SINK_URL"] = sink.url
    fleet.dispatcher("d1", lease_ms=LEASE_MS)
    fleet.worker("w1")
    fleet.worker("w2")
    return fleet


def check_every_acked_job_ran(load: Load, r_sink: redis.Redis, fleet: Fleet) -> dict[str, int]:
    def all_ran() -> bool:
        ran = counts(r_sink, STARTS)
        return all(rid in ran for rid in load.acked)

    wait_for(all_ran, 60, "every acknowledged job to run", fleet)
    return counts(r_sink, STARTS)


def test_killing_a_cluster_master_loses_no_acknowledged_job_and_spares_healthy_partitions(
    sink: RedisServer, tmp_path: Path
) -> None:
    cluster = RedisCluster(replicas=1, node_timeout_ms=NODE_TIMEOUT_MS,
                           extra_args=["--appendonly", "yes",
                                       "--cluster-require-full-coverage", "no"])
    cluster.start()
    fleet: Fleet | None = None
    try:
        url = cluster.cluster_url
        fleet = run_fleet(url, sink, tmp_path)
        client = Client(settings=Settings(redis_url=url, wait_timeout_ms=300))
        wait_for(lambda: started(client.r, ["d1", "w1", "w2"]), 30, "the fleet to start", fleet)
        victim = cluster.master_of_slot(keys.slot(keys.due(0)))
        replica = cluster.replica_of(victim)
        victim_parts = {p for p in range(16)
                        if cluster.master_of_slot(keys.slot(keys.due(p))) is victim}
        with Load(client) as load:
            time.sleep(3)
            replica.pause()  # the replica lags: writes to the victim cannot be confirmed
            # Paused alone it would read what the master sent from its socket buffer on
            # SIGCONT and lose nothing; with the link cut, the master's later writes die with it.
            command(victim.port, "CLIENT", "KILL", "TYPE", "replica")
            time.sleep(1.5)
            t_kill = time.time() * 1000
            victim.kill()
            replica.resume()
            cluster.wait_failover(victim)
            t_back = time.time() * 1000
            time.sleep(4)
        r_sink = sink.client()
        ran = check_every_acked_job_ran(load, r_sink, fleet)
        assert all(p.alive() for p in fleet.procs.values()), fleet.logs()
        assert load.refused["NotReplicated"] > 0, load.refused  # the lag was real
        # Duplicates are counted by run id: a run id of the load ran at most twice.
        assert max(ran[rid] for rid in load.acked) <= 2
        during = [rid for rid in load.acked if t_kill <= int(rid.rsplit("@", 1)[1]) <= t_back]
        healthy = [rid for rid in during if load.acked[rid] not in victim_parts]
        lag = start_lag_ms(client, healthy)
        assert len(lag) >= 20 and p99(lag) < 1000, (len(lag), p99(lag))
        client.close()
        print(f"FAILOVER cluster acked={len(load.acked)} refused={dict(load.refused)} "
              f"failover_s={(t_back - t_kill) / 1000:.2f} healthy_p99_ms={p99(lag)}")
    finally:
        if fleet is not None:
            fleet.close()
            print(fleet.logs())
        cluster.stop()


@pytest.mark.parametrize("how", ["kill -9", "SENTINEL FAILOVER"])
def test_a_sentinel_failover_is_followed_without_a_restart_and_loses_nothing_acknowledged(
    sink: RedisServer, tmp_path: Path, how: str
) -> None:
    group = RedisSentinelGroup(extra_args=["--appendonly", "yes"])
    group.start()
    fleet: Fleet | None = None
    try:
        fleet = run_fleet(group.url, sink, tmp_path)
        client = Client(settings=Settings(redis_url=group.url, wait_timeout_ms=300))
        wait_for(lambda: started(client.r, ["d1", "w1", "w2"]), 30, "the fleet to start", fleet)
        old = group.primary()
        with Load(client) as load:
            time.sleep(2)
            if how == "kill -9":
                old.kill()
                group.wait_new_primary(old)
            else:
                group.failover()
            time.sleep(4)
        ran = check_every_acked_job_ran(load, sink.client(), fleet)
        assert all(p.alive() for p in fleet.procs.values()), fleet.logs()
        assert max(ran[rid] for rid in load.acked) <= 2
        assert len(load.acked) > 200
        client.close()
        print(f"FAILOVER sentinel ({how}) acked={len(load.acked)} refused={dict(load.refused)}")
    finally:
        if fleet is not None:
            fleet.close()
            print(fleet.logs())
        group.stop()



def test_the_archiver_stores_only_events_a_replica_has(redis_available: None,
                                                       tmp_path: Path) -> None:
    """Under the durability setting the archiver's read ends in WAIT: while the replica lags,
    events wait in the archiver's pending list instead of reaching the store, so a failover
    cannot leave history of a job the promoted replica never had."""
    primary = RedisServer().start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        link = replica.client()
        wait_for(lambda: link.info("replication").get("master_link_status") == "up" or None,
                 20, "the replica to sync")
        r = connect(primary.url, wait=1, wait_timeout_ms=200)
        store = open_store(f"sqlite:///{tmp_path}/archive.db")
        a = Archiver(r, store, 16, ArchiverConfig(poll_ms=10))
        a.setup()
        with Client(settings=Settings(redis_url=primary.url, wait_replicas=0)) as c:
            replica.pause()
            c.schedule_many([JobSpec(type="t", run_at="2099-01-01T00:00:00Z") for _ in range(5)])
            held = a.run_once()
            assert (held.read, held.inserted) == (0, 0)
            replica.resume()
            stored = 0
            for _ in range(50):
                stored += a.run_once().inserted
                if stored >= 5:
                    break
            assert stored == 5
        store.close()
        r.close()
    finally:
        replica.close()
        primary.close()
