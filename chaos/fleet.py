"""The processes of one run: the Redis under test (AOF), the sink, the proxy host, dispatchers
and workers (each through proxies of its own) and the load generator.  With `redis="cluster"`
the Redis under test is a 3-master + 3-replica cluster (AOF on every node); each dispatcher and
worker gets a proxy per node, and a redis+cluster:// URL whose seeds are its proxies and whose
`address_remap` maps every node's advertised address to its proxy for that node, so every
connection it makes (slot map, commands, pub/sub, after a failover too: a restarted node keeps
its port) goes through its own proxies.  The runner and the load generator connect directly.
With `redis="sentinel"` it is a primary (AOF), its replica and three Sentinels, and every process
connects directly with the redis+sentinel:// URL (a Sentinel names the primary's own address,
which no proxy stands in for: no freeze or drop faults there).

Everything is started from the main thread (children die with the thread that started them, see
tests/support/redis_server._die_with_parent).  Each restart of a dispatcher or worker is a new
incarnation with a new id (`w2-3`: slot w2, fourth start), as a restarted process gets by
default (host and pid), so the history names exactly which process did what.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from support.redis_probe import HOST  # tests/support, see __init__
from support.redis_sentinel import RedisSentinelGroup
from support.redis_server import (
    RedisCluster,
    RedisServer,
    _die_with_parent,
    free_port,
)

from . import ROOT
from .config import RunConfig
from .sink import SINK_URL_ENV


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Member:
    """One dispatcher or worker slot and its current incarnation."""

    slot: str
    kind: str  # dispatcher | worker
    proxy: int  # index of its proxy in the proxy host
    incarnation: int = -1
    popen: subprocess.Popen[bytes] | None = None
    expect_exit: bool = False  # the nemesis killed it
    ids: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.slot}-{self.incarnation}"


class Fleet:
    def __init__(self, cfg: RunConfig, out: Path) -> None:
        self.cfg = cfg
        self.out = out
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(aof=True, appendfsync="everysec", port=free_port())
        self.cluster: RedisCluster | None = None
        if cfg.redis == "cluster":
            # Full coverage off: partitions on the healthy masters go on while one fails over.
            self.cluster = RedisCluster(
                replicas=1, node_timeout_ms=cfg.node_timeout_ms,
                extra_args=["--appendonly", "yes", "--cluster-require-full-coverage", "no"])
        self.sentinel: RedisSentinelGroup | None = None
        if cfg.redis == "sentinel":
            self.sentinel = RedisSentinelGroup(extra_args=["--appendonly", "yes"])
        self.sink = RedisServer()
        self.members = [Member(f"d{i + 1}", "dispatcher", i) for i in range(cfg.dispatchers)]
        self.members += [Member(f"w{i + 1}", "worker", cfg.dispatchers + i)
                         for i in range(cfg.workers)]
        self.by_slot = {m.slot: m for m in self.members}
        self.proxy_ports: list[list[int]] = []  # per member: its proxy of each upstream node
        self._proxyd: subprocess.Popen[str] | None = None
        self.load: subprocess.Popen[bytes] | None = None
        self.exits: list[dict[str, Any]] = []  # processes that exited on their own

    # --- servers and proxies -----------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        """What the runner and the load generator connect with."""
        if self.cluster is not None:
            return self.cluster.cluster_url
        return self.sentinel.url if self.sentinel is not None else self.redis.url

    @property
    def upstreams(self) -> list[RedisServer]:
        """The servers the processes' proxies lead to: the Redis under test, or every node."""
        return self.cluster.nodes if self.cluster is not None else [self.redis]

    def start_servers(self) -> None:
        self.sink.start()
        if self.sentinel is not None:  # no proxies: a Sentinel names the primary's own address
            self.sentinel.start()
            return
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.redis.start()
        ports = ",".join(str(n.port) for n in self.upstreams)
        self._proxyd = subprocess.Popen(
            [sys.executable, "-m", "chaos.proxyd", ports, str(len(self.members))],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent)
        assert self._proxyd.stdout is not None
        self.proxy_ports = json.loads(self._proxyd.stdout.readline())

    def proxy(self, verb: str, slot: str) -> None:
        """freeze, thaw or drop the connections of one process."""
        assert self._proxyd and self._proxyd.stdin and self._proxyd.stdout
        self._proxyd.stdin.write(f"{verb} {self.by_slot[slot].proxy}\n")
        self._proxyd.stdin.flush()
        if self._proxyd.stdout.readline().strip() != "ok":
            raise RuntimeError(f"proxy host did not confirm {verb} {slot}")

    # --- rsched processes --------------------------------------------------------------------

    def env(self, redis_url: str) -> dict[str, str]:
        env = dict(os.environ, RSCHED_REDIS_URL=redis_url,
                   RSCHED_PARTITIONS=str(self.cfg.partitions))
        env[SINK_URL_ENV] = self.sink.url
        # The checker reads every event the run made (chaos/history.py): no archiver runs, so
        # the dispatchers must not trim the events streams to their default bound.
        env.update(RSCHED_EVENTS_KEEP="0", RSCHED_EVENTS_KEEP_MS="0")
        if self.cluster is not None or self.sentinel is not None:
            # A write waits this long for its replica: while the nemesis pauses a replica
            # (lag_s) the load generator's writes to its master are refused (NotReplicated)
            # several times instead of once.
            env.setdefault("RSCHED_WAIT_TIMEOUT_MS", str(self.cfg.wait_timeout_ms))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        return env

    def member_url(self, m: Member) -> str:
        """The URL a dispatcher or worker connects with: through its own proxies."""
        if self.sentinel is not None:
            return self.redis_url
        ports = self.proxy_ports[m.proxy]
        if self.cluster is None:
            return f"redis://{HOST}:{ports[0]}/0"
        seeds = ",".join(f"{HOST}:{p}" for p in ports)
        remap = ",".join(f"{HOST}:{n.port}={HOST}:{p}"
                         for n, p in zip(self.upstreams, ports, strict=True))
        return f"redis+cluster://{seeds}?address_remap={remap}"

    def spawn(self, slot: str) -> str:
        m = self.by_slot[slot]
        m.incarnation += 1
        m.expect_exit = False
        c = self.cfg
        argv = [sys.executable, "-m", "rsched.cli", m.kind, "--id", m.id]
        if m.kind == "dispatcher":
            argv += ["--lease-ms", str(c.lease_ms)]
        else:
            argv += ["--app", "chaos.app:app", "--concurrency", str(c.concurrency),
                     "--visibility-ms", str(c.visibility_ms), "--heartbeat-ms",
                     str(c.heartbeat_ms), "--dead-after", repr(c.dead_after_ms / 1000),
                     "--grace", "2"]
        url = self.member_url(m)
        with open(self.out / "logs" / f"{m.id}.log", "wb") as log:
            m.popen = subprocess.Popen(argv, env=self.env(url), cwd=ROOT,
                                       stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        m.ids.append(m.id)
        return m.id

    def signal(self, slot: str, sig: signal.Signals) -> str:
        m = self.by_slot[slot]
        assert m.popen is not None
        if sig == signal.SIGKILL:
            m.expect_exit = True
        m.popen.send_signal(sig)
        if sig == signal.SIGKILL:
            m.popen.wait(10)
        return m.id

    def poll(self) -> list[dict[str, Any]]:
        """Processes that exited without the nemesis killing them: recorded, then restarted so
        the run goes on."""
        found = []
        for m in self.members:
            if m.popen is None or m.expect_exit or m.popen.poll() is None:
                continue
            log = self.out / "logs" / f"{m.id}.log"
            tail = log.read_text(errors="replace").splitlines()[-8:]
            found.append({"process": m.id, "rc": m.popen.returncode, "at_ms": now_ms(),
                          "log_tail": tail})
            self.spawn(m.slot)
        self.exits += found
        return found

    def start_load(self, out: Path) -> None:
        c = self.cfg
        argv = [sys.executable, "-m", "chaos.load", "--redis-url", self.redis_url,
                "--out", str(out), "--rate", str(c.rate_per_s), "--seed", str(c.seed),
                "--slow-lo", str(c.slow_s[0]), "--slow-hi", str(c.slow_s[1]),
                "--max-attempts", str(c.max_attempts), "--limit-keys", str(c.limit_keys)]
        err: IO[bytes]
        with open(self.out / "logs" / "load.log", "wb") as err:
            self.load = subprocess.Popen(argv, cwd=ROOT, env=self.env(self.redis_url),
                                         stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                         preexec_fn=_die_with_parent)

    def stop_load(self) -> None:
        if self.load is not None and self.load.poll() is None:
            self.load.send_signal(signal.SIGTERM)
            self.load.wait(15)

    def load_exited(self) -> bool:
        return self.load is not None and self.load.poll() is not None

    def close(self) -> None:
        for m in self.members:
            if m.popen is not None and m.popen.poll() is None:
                m.popen.send_signal(signal.SIGCONT)
                m.popen.kill()
                m.popen.wait(10)
        if self.load is not None and self.load.poll() is None:
            self.load.kill()
            self.load.wait(10)
        if self._proxyd is not None:
            self._proxyd.kill()
            self._proxyd.wait(10)
            for pipe in (self._proxyd.stdin, self._proxyd.stdout):
                if pipe is not None:
                    pipe.close()
        if self.cluster is not None:
            for i, node in enumerate(self.cluster.nodes):
                node.kill()
                if node.log_path.exists():
                    shutil.copyfile(node.log_path, self.out / "logs" / f"redis-node{i}.log")
            self.cluster.stop()
        if self.sentinel is not None:
            for i, node in enumerate(self.sentinel.nodes):
                node.kill()
                if node.log_path.exists():
                    shutil.copyfile(node.log_path, self.out / "logs" / f"redis-node{i}.log")
            for i, s in enumerate(self.sentinel.sentinels):
                if s.log_path.exists():
                    shutil.copyfile(s.log_path, self.out / "logs" / f"sentinel{i}.log")
            self.sentinel.stop()
        self.redis.kill()
        # Evidence for the next failure: the log of every incarnation (AOF loads, truncations).
        if self.redis.log_path.exists():
            shutil.copyfile(self.redis.log_path, self.out / "logs" / "redis.log")
        self.redis.close()
        self.sink.close()
