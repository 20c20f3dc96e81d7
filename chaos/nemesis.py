"""The nemesis: seeded faults, one at a time, each logged with wall-clock times (ms).

Kinds: kill -9 a worker or dispatcher (restarted 0.3-1.5 s later as a new incarnation); SIGSTOP
one past its dead-after or lease (1.3-2x) and SIGCONT; freeze its proxy as long (bytes
held both ways) and thaw; drop its connections; kill -9 redis-server and restart it from its
AOF; lose the machine under redis-server (restart from the AOF as of a simulated last fsync
0.2-1 s before the kill, chaos.aof).  The first faults cover every kind once in a seeded order;
after that kinds are drawn at random, Redis faults at most every `redis_fault_every_s`.

On a cluster (`redis="cluster"`) a process's proxies are one per node (chaos.fleet): a freeze
or drop acts on all of them at once.  The Redis fault there is `redis_master_kill`: pause a
master's replica and cut its replication link, for 1-2 s (it lags: writes the master takes
meanwhile are not on it), kill -9 the master, resume the replica, wait until it is promoted,
then restart the old master from its AOF so it rejoins as a replica of the new one, and wait
until the cluster is healthy again.  On Sentinel (`redis="sentinel"`: no proxies, so no freeze
and no drop) the Redis fault is `redis_primary_kill`, the same with the primary: its replica cut
off and paused, the primary killed, the replica resumed and promoted by the Sentinels, the old
primary restarted from its AOF (the Sentinels turn it into the new primary's replica).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.redis_probe import RedisServerError, command  # tests/support, see __init__
from support.redis_server import RedisServer

from rsched.rdb import keys

from . import aof
from .config import RunConfig
from .fleet import Fleet, now_ms

PROCESS_KINDS = ("kill_worker", "kill_dispatcher", "stop_worker", "stop_dispatcher",
                 "freeze_worker", "freeze_dispatcher", "drop")
REDIS_KINDS = ("redis_kill", "redis_lose")
KINDS = PROCESS_KINDS + REDIS_KINDS
CLUSTER_PROCESS_KINDS = PROCESS_KINDS
CLUSTER_REDIS_KINDS = ("redis_master_kill",)
CLUSTER_KINDS = CLUSTER_PROCESS_KINDS + CLUSTER_REDIS_KINDS
SENTINEL_PROCESS_KINDS = tuple(k for k in PROCESS_KINDS
                               if not k.startswith("freeze") and k != "drop")  # no proxies
SENTINEL_REDIS_KINDS = ("redis_primary_kill",)


def kinds(cfg: RunConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(process faults, Redis faults) of this run's Redis."""
    if cfg.redis == "cluster":
        return CLUSTER_PROCESS_KINDS, CLUSTER_REDIS_KINDS
    if cfg.redis == "sentinel":
        return SENTINEL_PROCESS_KINDS, SENTINEL_REDIS_KINDS
    return PROCESS_KINDS, REDIS_KINDS
WEIGHTS = {"redis_kill": 1, "redis_lose": 1, "drop": 2}  # others: 2


class Nemesis:
    def __init__(self, fleet: Fleet, cfg: RunConfig, log_path: Path) -> None:
        self.fleet = fleet
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 7919 + 1)
        self.log_path = log_path
        self.log: list[dict[str, Any]] = []
        self.process_kinds, self.redis_kinds = kinds(cfg)
        self.kinds = self.process_kinds + self.redis_kinds
        self._pending = list(self.kinds)
        self._last_redis = -1e9
        self._marks = 0

    # --- waiting ---------------------------------------------------------------------------

    def idle(self, seconds: float) -> None:
        """Sleep, watching for processes that exit on their own (recorded and restarted)."""
        end = time.monotonic() + seconds
        while True:
            self.fleet.poll()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.05, left))

    def run(self, until: float, on_gap: Callable[[], None] = lambda: None) -> None:
        """Faults until `until` (time.monotonic); `on_gap` runs between two of them."""
        self.idle(3.0)  # warm-up: every process running, load flowing
        while time.monotonic() < until - 1:
            kind = self._next_kind()
            entry: dict[str, Any] = {"op": kind}
            getattr(self, "_" + kind)(entry)
            self.log.append(entry)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            on_gap()
            self.idle(self.rng.uniform(*self.cfg.fault_gap_s))

    def _next_kind(self) -> str:
        redis_ok = time.monotonic() - self._last_redis >= self.cfg.redis_fault_every_s
        pool = [k for k in (self._pending or self.kinds) if redis_ok or k not in self.redis_kinds]
        if not pool:
            pool = list(self.process_kinds)
        if self._pending:
            kind = self.rng.choice(pool)
            if kind in self._pending:
                self._pending.remove(kind)
        else:
            kind = self.rng.choices(pool, [WEIGHTS.get(k, 2) for k in pool])[0]
        if kind in self.redis_kinds:
            self._last_redis = time.monotonic()
        return kind

    def _pick(self, kind: str) -> str:
        return self.rng.choice([m.slot for m in self.fleet.members if m.kind == kind])

    # --- process faults ----------------------------------------------------------------------

    def _kill(self, entry: dict[str, Any], kind: str) -> None:
        slot = self._pick(kind)
        entry.update(target=slot, t0=now_ms())
        entry["process"] = self.fleet.signal(slot, signal.SIGKILL)
        self.idle(self.rng.uniform(0.3, 1.5))
        entry["restarted_as"] = self.fleet.spawn(slot)
        entry["t1"] = now_ms()

    def _stop(self, entry: dict[str, Any], kind: str, past_ms: int) -> None:
        slot = self._pick(kind)
        seconds = past_ms / 1000 * self.rng.uniform(1.3, 2.0)
        entry.update(target=slot, t0=now_ms())
        entry["process"] = self.fleet.signal(slot, signal.SIGSTOP)
        self.idle(seconds)
        self.fleet.signal(slot, signal.SIGCONT)
        entry["t1"] = now_ms()

    def _freeze(self, entry: dict[str, Any], kind: str, past_ms: int) -> None:
        slot = self._pick(kind)
        seconds = past_ms / 1000 * self.rng.uniform(1.3, 2.0)
        entry.update(target=slot, process=self.fleet.by_slot[slot].id, t0=now_ms())
        self.fleet.proxy("freeze", slot)
        self.idle(seconds)
        self.fleet.proxy("thaw", slot)
        entry["t1"] = now_ms()

    def _kill_worker(self, entry: dict[str, Any]) -> None:
        self._kill(entry, "worker")

    def _kill_dispatcher(self, entry: dict[str, Any]) -> None:
        self._kill(entry, "dispatcher")

    def _stop_worker(self, entry: dict[str, Any]) -> None:
        self._stop(entry, "worker", self.cfg.takeover_ms)

    def _stop_dispatcher(self, entry: dict[str, Any]) -> None:
        self._stop(entry, "dispatcher", self.cfg.lease_ms)

    def _freeze_worker(self, entry: dict[str, Any]) -> None:
        self._freeze(entry, "worker", self.cfg.takeover_ms)

    def _freeze_dispatcher(self, entry: dict[str, Any]) -> None:
        self._freeze(entry, "dispatcher", self.cfg.lease_ms)

    def _drop(self, entry: dict[str, Any]) -> None:
        slot = self.rng.choice([m.slot for m in self.fleet.members])
        entry.update(target=slot, process=self.fleet.by_slot[slot].id, t0=now_ms())
        self.fleet.proxy("drop", slot)
        entry["t1"] = now_ms()

    # --- Redis faults ------------------------------------------------------------------------

    def _restart_redis(self, entry: dict[str, Any]) -> None:
        self.idle(self.rng.uniform(0.3, 1.0))
        # t0 is read before the kill, and the dying server answers until the signal lands: a
        # reply read before this moment can only have come from it.
        entry["respawn_ms"] = now_ms()
        started = time.monotonic()
        self.fleet.redis.start()  # returns once it answers PING (after loading the AOF)
        entry["t1"] = now_ms()
        entry["load_s"] = round(time.monotonic() - started, 2)

    def _redis_kill(self, entry: dict[str, Any]) -> None:
        entry.update(target="redis", t0=now_ms())
        self.fleet.redis.kill()
        self._restart_redis(entry)

    def _redis_lose(self, entry: dict[str, Any]) -> None:
        self._marks += 1
        m = aof.mark(self.fleet.redis.dir, self._marks)
        self.idle(self.rng.uniform(0.2, self.cfg.aof_window_s))
        entry.update(target="redis", t0=now_ms())
        self.fleet.redis.kill()
        if m is None:  # an AOF rewrite swapped the files: a plain crash this time
            entry["op"] = "redis_kill"
        else:
            torn = aof.restore(self.fleet.redis.dir, m)
            if torn:  # the mark fell inside a write(): cut back to a whole command
                entry["torn_bytes"] = sum(torn.values())
            entry["fsynced_ms"] = m.at_ms
            entry["window_ms"] = entry["t0"] - m.at_ms
        self._restart_redis(entry)

    def _redis_master_kill(self, entry: dict[str, Any]) -> None:
        cluster = self.fleet.cluster
        assert cluster is not None
        victim = self.rng.choice(sorted(cluster.masters(), key=lambda n: n.port))
        parts = [p for p in range(self.cfg.partitions)
                 if cluster.master_of_slot(keys.slot(keys.due(p))) is victim]
        self._kill_lagging(entry, victim, cluster.replica_of(victim), parts,
                           lambda: cluster.wait_failover(victim))
        # Restarted with the same port and dir, it rejoins from its nodes.conf, as a replica.
        cluster.wait_healthy(timeout_s=30)
        entry["healthy_ms"] = now_ms()

    def _redis_primary_kill(self, entry: dict[str, Any]) -> None:
        group = self.fleet.sentinel
        assert group is not None
        victim = group.primary()
        self._kill_lagging(entry, victim, group.other(victim), list(range(self.cfg.partitions)),
                           lambda: group.wait_new_primary(victim))
        # Restarted from its AOF, the Sentinels make it the new primary's replica... or, now and
        # then, the primary again and the promoted node its replica (which then drops what it
        # took since its promotion): wait for whichever they name.
        deadline = time.monotonic() + 90
        while True:
            primary = group.primary()
            try:
                group.wait_healthy(primary, timeout_s=15)
                break
            except RedisServerError:
                if time.monotonic() > deadline:
                    raise
        entry["healthy_ms"] = now_ms()
        entry["failed_back"] = primary is victim

    def _kill_lagging(self, entry: dict[str, Any], victim: RedisServer, replica: RedisServer,
                      partitions: list[int], promotion: Callable[[], RedisServer]) -> None:
        """Cut ``victim``'s replica off, let ``victim`` take writes for lag_s, kill it -9,
        resume the replica, wait for its ``promotion``, restart the victim."""
        entry.update(target=f"redis:{victim.port}", replica=replica.port, partitions=partitions)
        entry["lagged_ms"] = now_ms()  # from here on the master's writes are not on its replica
        replica.pause()
        # A paused replica alone does not lag: what the master sends waits in the replica's
        # socket buffer and is read on SIGCONT, before it notices the master is gone (a run
        # with WAIT off lost nothing so).  Cutting the link keeps the master's later writes
        # in its own backlog, which dies with it.
        entry["links_cut"] = command(victim.port, "CLIENT", "KILL", "TYPE", "replica")
        self.idle(self.rng.uniform(*self.cfg.lag_s))
        entry["t0"] = now_ms()
        victim.kill()
        replica.resume()
        promoted = promotion()
        entry["t1"] = now_ms()
        entry["promoted"] = promoted.port
        victim.restart()
