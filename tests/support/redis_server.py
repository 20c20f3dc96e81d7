"""Real `redis-server` processes for tests: plain, AOF and cluster (with or without replicas).

Sentinel groups live in redis_sentinel.py; both ask their nodes through redis_probe.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as RedisClusterClient

from support.redis_probe import (
    HOST,
    NodeGroup,
    NotYet,
    RedisServerError,
    command,
    replicating_from,
    role,
    slot_ranges,
    streams_to,
    view_counts,
    wait_for,
)

__all__ = ["RedisCluster", "RedisServer", "RedisServerError", "free_port"]

READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1
CLUSTER_SLOTS = 16384


_HANDED_OUT: set[int] = set()  # ports free_port gave: servers not started yet do not hold theirs


def free_port() -> int:
    """A port free on 127.0.0.1, below Linux's ephemeral range so no client socket takes it,
    and never one this process was given before (a cluster picks every node's port and bus port
    before starting any: two picks could collide)."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise RedisServerError("no free port found in 20000-32000")


def _ping(port: int) -> bool:
    """One raw PING, no client retries: True on +PONG (not while -LOADING the AOF)."""
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _die_with_parent() -> None:
    """Runs in the child before exec: a crashed test run must not leave servers behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class RedisServer:
    """One `redis-server` on 127.0.0.1 in its own temp dir; port and dir survive restart().

    The server dies with the process (thread) that started it, so start it from the main thread.
    """

    def __init__(
        self,
        *,
        aof: bool = False,
        appendfsync: str = "everysec",
        maxmemory_policy: str = "noeviction",
        extra_args: Sequence[str] = (),
        port: int | None = None,
        executable: str = "redis-server",
    ) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync: {appendfsync!r} is not always, everysec or no")
        self.aof = aof
        self.appendfsync = appendfsync
        self.maxmemory_policy = maxmemory_policy
        self.extra_args = list(extra_args)
        self._port_fixed = port is not None
        self.port = port if port is not None else free_port()
        self.executable = executable
        self.dir = Path(tempfile.mkdtemp(prefix="rsched-redis-"))
        self.log_path = self.dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._clients: list[Any] = []

    # -- addresses and clients ------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client on this server, closed by stop(), kill() and close()."""
        client = redis.Redis.from_url(self.url, **kwargs)
        self._clients.append(client)
        return client

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> RedisServer:
        if self.is_running():
            raise RedisServerError(f"redis-server on port {self.port} is already running")
        for attempt in range(5):
            self._spawn()
            try:
                self._wait_ready()
                return self
            except RedisServerError:
                self._reap()
                in_use = "Address already in use" in self.log_tail()
                if not in_use or self._port_fixed or attempt == 4:
                    raise
                self.port = free_port()  # lost a race for the port: pick another one
                args = list(self.extra_args)  # and for the cluster bus port, if it has one
                if "--cluster-port" in args:
                    args[args.index("--cluster-port") + 1] = str(free_port())
                    self.extra_args = args
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM and wait: Redis flushes its AOF and exits cleanly."""
        self._close_clients()
        if not self.is_running():
            self._reap()
            return
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        self.resume()  # a stopped process only sees the SIGTERM once it runs again
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise RedisServerError(self._message("did not exit on SIGTERM")) from None
        finally:
            self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash; whatever Redis had written to its AOF stays."""
        self._close_clients()
        if self.is_running():
            assert self._proc is not None
            self._proc.kill()
            self._proc.wait()
        self._reap()

    def restart(self) -> RedisServer:
        """Stop (if running) and start again on the same port and dir."""
        self.stop()
        port_fixed, self._port_fixed = self._port_fixed, True
        try:
            return self.start()
        finally:
            self._port_fixed = port_fixed

    def pause(self) -> None:
        """SIGSTOP: the server holds its connections but answers nothing."""
        if not self.is_running():
            raise RedisServerError(f"redis-server on port {self.port} is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        if self._paused and self.is_running():
            assert self._proc is not None
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Kill the server and delete its dir."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def config_lines(self) -> list[str]:
        lines = [
            f"port {self.port}",
            f"bind {HOST}",
            f"dir {self.dir}",
            f"logfile {self.log_path}",
            "daemonize no",
            'save ""',
            f"appendonly {'yes' if self.aof else 'no'}",
            f"appendfsync {self.appendfsync}",
            f"maxmemory-policy {self.maxmemory_policy}",
        ]
        return lines

    def _spawn(self) -> None:
        conf = self.dir / "redis.conf"
        conf.write_text("\n".join(self.config_lines()) + "\n")
        # stdout/stderr share the log: config errors are printed before the logfile is open.
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [self.executable, str(conf), *self.extra_args],
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self._paused = False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RedisServerError(self._message(f"exited with {self._proc.returncode}"))
            if _ping(self.port):
                return
            if time.monotonic() > deadline:
                raise RedisServerError(self._message(f"no PONG in {READY_TIMEOUT_S} s"))
            time.sleep(0.02)

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        self._paused = False

    def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _message(self, what: str) -> str:
        return f"redis-server on {HOST}:{self.port} {what}; log {self.log_path}:\n{self.log_tail()}"


class RedisCluster(NodeGroup):
    """Masters with `replicas` replicas each, every slot assigned, stopped by PID.

    start() returns once every node says cluster_state:ok, every node's view agrees on who is
    master and replica, and every replica is in sync. Node ids are kept from start(), so a
    killed master can still be found in the others' views.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
        extra_args: Sequence[str] = (),
    ) -> None:
        if masters < 3:
            raise ValueError(f"masters: redis-cli --cluster create needs 3, got {masters}")
        if replicas < 0:
            raise ValueError(f"replicas: must be 0 or more, got {replicas}")
        if node_timeout_ms < 100:
            raise ValueError(f"node_timeout_ms: must be at least 100, got {node_timeout_ms}")
        self.master_count = masters
        self.replicas_per_master = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes = [RedisServer() for _ in range(masters * (1 + replicas))]
        for node in self.nodes:
            node.extra_args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(node.dir / "nodes.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-port", str(free_port()),
                "--repl-diskless-sync-delay", "0",  # a replica syncs now, not 5 s later
                *extra_args,
            ]  # fmt: skip
        self._ids: dict[RedisServer, str] = {}
        self._first_slot: dict[str, int] = {}  # master id -> a slot it held when last settled
        self._clients: list[RedisClusterClient] = []

    # -- addresses and clients ------------------------------------------------------------

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(HOST, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """Any one node: a cluster client discovers the others from it."""
        return self.nodes[0].url

    @property
    def cluster_url(self) -> str:
        """Every node, in rsched's scheme for Redis Cluster."""
        return "redis+cluster://" + ",".join(f"{HOST}:{node.port}" for node in self.nodes)

    def client(self, **kwargs: Any) -> RedisClusterClient:
        client = RedisClusterClient(startup_nodes=self.startup_nodes, **kwargs)
        self._clients.append(client)
        return client

    # -- topology -------------------------------------------------------------------------

    def masters(self) -> list[RedisServer]:
        """Running nodes that say they are masters."""
        return [n for n in self._live() if role(n.port) == "master"]

    def replicas(self) -> list[RedisServer]:
        """Running nodes that say they are replicas."""
        return [n for n in self._live() if role(n.port) == "slave"]

    def master_of_slot(self, slot: int) -> RedisServer:
        """The owner of `slot` in the view of the first running node."""
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ValueError(f"slot: {slot} is not in 0-{CLUSTER_SLOTS - 1}")
        for first, last, owner in slot_ranges(self._live()[0].port):
            if first <= slot <= last:
                return self._by_id(owner)
        raise RedisServerError(f"slot {slot} has no owner")

    def replica_of(self, master: RedisServer) -> RedisServer:
        """A replica the master is streaming to right now (ROLE on the master)."""
        reply = command(master.port, "ROLE")
        if reply[0] != "master" or not reply[2]:
            raise RedisServerError(f"node {master.port} is not a master with a replica: {reply}")
        return self._by_port(int(reply[2][0][1]))

    def flushall(self) -> None:
        """Empty every master (keys and script cache), for tests that share a cluster."""
        for node in self.masters():
            command(node.port, "FLUSHALL")
            command(node.port, "SCRIPT", "FLUSH")

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
        except BaseException:
            self.stop()  # no node left running (nor its Popen to warn when collected)
            raise
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        cmd = ["redis-cli", "--cluster", "create", *addresses]
        cmd += ["--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RedisServerError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        self._ids = {node: command(node.port, "CLUSTER", "MYID") for node in self.nodes}
        self.wait_healthy()
        return self

    def wait_healthy(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Every node running, cluster_state:ok everywhere, every view shows all masters and
        replicas with no failure flags, and every replica in sync: as after start()."""
        want = {"master": self.master_count, "slave": self.master_count * self.replicas_per_master}

        def healthy() -> None:
            for node in self.nodes:
                if not node.is_running() or node.paused:
                    raise RedisServerError(f"node {node.port} is not running")
                self._expect_ok(node)
                if (seen := view_counts(node.port)) != want:
                    raise NotYet(f"node {node.port} sees {seen or 'a failing node'}, not {want}")
                if not self._in_sync(node):
                    raise NotYet(f"node {node.port}: replication not in sync")

        wait_for(healthy, timeout_s, f"cluster {self.cluster_url} healthy")
        self._remember_slots()

    def wait_failover(self, old_master: RedisServer, timeout_s: float | None = None) -> RedisServer:
        """Wait until a replica of `old_master` (killed, paused or failed) owns its slots as a
        master in every running node's view and they all say cluster_state:ok; returns it.

        The default timeout is the node timeout plus 15 s: detection takes the node timeout,
        the election up to ~2 s more, and the machine is shared."""
        old_id = self._ids[old_master]
        slot = self._first_slot.get(old_id)
        if slot is None:
            raise ValueError(f"old_master: node {old_master.port} held no slots when last settled")
        timeout = self.node_timeout_ms / 1000 + 15 if timeout_s is None else timeout_s
        others = [n for n in self.nodes if n is not old_master]

        def promoted() -> RedisServer:
            owners = set()
            for node in others:
                if node.is_running() and not node.paused:
                    self._expect_ok(node)
                    owners |= {o for a, b, o in slot_ranges(node.port) if a <= slot <= b}
            if len(owners) != 1 or old_id in owners:
                raise NotYet(f"slot {slot} is owned by {owners} (old master {old_id})")
            new = self._by_id(owners.pop())
            if role(new.port) != "master":
                raise NotYet(f"node {new.port} owns slot {slot} but is not a master yet")
            return new

        new = wait_for(promoted, timeout, f"a replica of node {old_master.port} promoted")
        self._remember_slots()
        return new

    def stop(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        for node in self.nodes:
            node.close()

    # -- internals ------------------------------------------------------------------------

    def _live(self) -> list[RedisServer]:
        live = [n for n in self.nodes if n.is_running() and not n.paused]
        if not live:
            raise RedisServerError("no node of the cluster is running")
        return live

    def _by_id(self, node_id: str) -> RedisServer:
        for node, known in self._ids.items():
            if known == node_id:
                return node
        raise RedisServerError(f"node id {node_id} is not one of this cluster's")

    def _by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RedisServerError(f"port {port} is not one of this cluster's")

    def _remember_slots(self) -> None:
        self._first_slot = {}
        for first, _last, owner in slot_ranges(self._live()[0].port):
            self._first_slot.setdefault(owner, first)

    @staticmethod
    def _expect_ok(node: RedisServer) -> None:
        if "cluster_state:ok" not in command(node.port, "CLUSTER", "INFO"):
            raise NotYet(f"node {node.port} does not say cluster_state:ok")

    def _in_sync(self, node: RedisServer) -> bool:
        """A replica's link is up; a master streams to all of its replicas."""
        if replicating_from(node.port) is not None:
            return True
        return role(node.port) == "master" and streams_to(node.port) == self.replicas_per_master
