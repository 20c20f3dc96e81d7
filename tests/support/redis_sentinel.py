"""A primary, a replica and three Sentinels, real processes on free ports, stopped by PID."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis

from support.redis_probe import (
    HOST,
    NodeGroup,
    NotYet,
    RedisServerError,
    command,
    replicating_from,
    role,
    wait_for,
)
from support.redis_server import READY_TIMEOUT_S, RedisServer

__all__ = ["RedisSentinelGroup", "SentinelServer"]

QUORUM = 2
SETTLE_TIMEOUT_S = 40.0
_DOWN_FLAGS = {"s_down", "o_down", "disconnected"}


class SentinelServer(RedisServer):
    """One `redis-server --sentinel` monitoring `primary`. Sentinel rewrites its own config
    file (id, epoch, what it learnt), so a restart reuses that file instead of a fresh one."""

    def __init__(
        self, primary: RedisServer, *, service: str, down_after_ms: int, failover_timeout_ms: int
    ) -> None:
        super().__init__(extra_args=["--sentinel"])
        self.primary = primary  # read at first start: the primary's port is final by then
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def config_lines(self) -> list[str]:
        conf = self.dir / "redis.conf"
        if conf.exists():  # keep Sentinel's rewrites; only the port may have moved (lost race)
            lines = conf.read_text().splitlines()
            return [f"port {self.port}" if line.startswith("port ") else line for line in lines]
        service = self.service
        return [
            f"port {self.port}",
            f"bind {HOST}",
            f"dir {self.dir}",
            f"logfile {self.log_path}",
            "daemonize no",
            f"sentinel monitor {service} {HOST} {self.primary.port} {QUORUM}",
            f"sentinel down-after-milliseconds {service} {self.down_after_ms}",
            f"sentinel failover-timeout {service} {self.failover_timeout_ms}",
        ]

    def ask(self, *args: str) -> Any:
        """A SENTINEL subcommand about the service, e.g. ask("REPLICAS")."""
        return command(self.port, "SENTINEL", args[0], self.service, *args[1:])

    def instances(self, what: str) -> dict[int, set[str]]:
        """Port -> flags of each replica ("REPLICAS") or other Sentinel ("SENTINELS") it knows."""
        found = {}
        for entry in self.ask(what):
            # redis-py 8 turns each entry into a dict; 6 leaves it a flat [name, value, ...] list
            fields = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2],
                                                                        strict=True))
            flags = set(fields["flags"].split(","))
            if what == "REPLICAS" and fields.get("master-link-status") != "ok":
                flags.add("disconnected")
            found[int(fields["port"])] = flags
        return found


class RedisSentinelGroup(NodeGroup):
    """nodes[0] starts as the primary, nodes[1] as its replica; three Sentinels watch them with
    quorum 2. start() returns once every Sentinel names the primary and knows the replica and
    both other Sentinels. `extra_args` go to the two data nodes only."""

    def __init__(
        self,
        *,
        service: str = "rsched",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
    ) -> None:
        if not service or any(c.isspace() or c == "/" for c in service):
            raise ValueError(f"service: {service!r} must be a non-empty name without / or spaces")
        if down_after_ms < 100:
            raise ValueError(f"down_after_ms: must be at least 100, got {down_after_ms}")
        if failover_timeout_ms < 1000:
            raise ValueError(
                f"failover_timeout_ms: must be at least 1000, got {failover_timeout_ms}"
            )
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        # A replica starts its sync at once instead of the master's default 5 s wait for more.
        node_args = ["--repl-diskless-sync-delay", "0", *extra_args]
        self.nodes = [RedisServer(extra_args=node_args) for _ in range(2)]
        self.sentinels = [
            SentinelServer(
                self.nodes[0], service=service, down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for _ in range(3)
        ]  # fmt: skip

    @property
    def url(self) -> str:
        """rsched's scheme for Sentinel: every Sentinel, then the service name."""
        sentinels = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{sentinels}/{self.service}"

    @property
    def failover_wait_s(self) -> float:
        """Default bound for a failover: detection (down-after), the vote and promotion (well
        under one failover-timeout here), plus 15 s for a shared, noisy machine."""
        return (self.down_after_ms + self.failover_timeout_ms) / 1000 + 15

    def primary(self) -> RedisServer:
        """The data node the first answering Sentinel names as primary."""
        for sentinel in self._live_sentinels():
            with contextlib.suppress(RedisServerError, redis.RedisError):
                return self._node_named_by(sentinel)
        raise RedisServerError(f"no Sentinel of {self.url} names a primary")

    def other(self, node: RedisServer) -> RedisServer:
        """The data node that is not `node`."""
        return self.nodes[1] if node is self.nodes[0] else self.nodes[0]

    def start(self) -> RedisSentinelGroup:
        primary, replica = self.nodes
        for node in self.nodes:
            node.start()
        command(replica.port, "REPLICAOF", HOST, primary.port)
        # Sentinels learn replicas from the primary's INFO: in sync first, so the first INFO
        # already lists it (otherwise the next comes up to 10 s later).
        wait_for(lambda: self._expect_replica(replica, primary), READY_TIMEOUT_S, "replica in sync")
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_healthy(primary)
        return self

    def wait_healthy(self, primary: RedisServer, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """`primary` is master and named by every running Sentinel; the other node (if running)
        replicates from it, and every running Sentinel knows it and the other Sentinels.

        After a failover this takes 10-25 s: a Sentinel turns the old primary into a replica
        only after it reported master for 8 s, and sees link states at its 10 s INFO refresh."""
        replica = self.other(primary)
        replica_up = replica.is_running() and not replica.paused

        def healthy() -> None:
            sentinels = self._expect_named(primary)
            if replica_up:
                self._expect_replica(replica, primary)
            for sentinel in sentinels:
                others = {s.port for s in sentinels if s is not sentinel}
                self._expect_known(sentinel, "SENTINELS", others)
                if replica_up:
                    self._expect_known(sentinel, "REPLICAS", {replica.port})

        wait_for(healthy, timeout_s, f"Sentinel group {self.url} with primary {primary.port}")

    def failover(self, timeout_s: float | None = None) -> RedisServer:
        """SENTINEL FAILOVER, then wait until every Sentinel names the other node and it says it
        is master; returns it. The old primary becomes its replica later (see wait_healthy)."""
        old = self.primary()
        self._live_sentinels()[0].ask("FAILOVER")
        return self.wait_new_primary(old, timeout_s)

    def wait_new_primary(self, old: RedisServer, timeout_s: float | None = None) -> RedisServer:
        """After `old` was killed, paused or failed over: wait until every running Sentinel
        names the other node and it says it is master; returns it."""
        new = self.other(old)
        timeout = self.failover_wait_s if timeout_s is None else timeout_s
        wait_for(lambda: self._expect_named(new), timeout, f"node {new.port} primary of {self.url}")
        return new

    def stop(self) -> None:
        for server in [*self.sentinels, *self.nodes]:
            server.close()

    # -- internals ------------------------------------------------------------------------

    def _live_sentinels(self) -> list[SentinelServer]:
        return [s for s in self.sentinels if s.is_running() and not s.paused]

    def _node_named_by(self, sentinel: SentinelServer) -> RedisServer:
        reply = sentinel.ask("GET-MASTER-ADDR-BY-NAME")
        if not reply:
            raise RedisServerError(f"Sentinel {sentinel.port} does not know {self.service!r}")
        port = int(reply[1])
        for node in self.nodes:
            if node.port == port:
                return node
        raise RedisServerError(f"Sentinel {sentinel.port} names {reply}, not a node of the group")

    def _expect_named(self, primary: RedisServer) -> list[SentinelServer]:
        """Every running Sentinel names `primary` and it says it is master; returns them."""
        sentinels = self._live_sentinels()
        for sentinel in sentinels:
            if self._node_named_by(sentinel) is not primary:
                raise NotYet(f"Sentinel {sentinel.port} names another primary")
        if role(primary.port) != "master":
            raise NotYet(f"node {primary.port} does not say it is master yet")
        return sentinels

    @staticmethod
    def _expect_replica(replica: RedisServer, primary: RedisServer) -> None:
        if replicating_from(replica.port) != primary.port:
            raise NotYet(f"node {replica.port} is not in sync with {primary.port}")

    @staticmethod
    def _expect_known(sentinel: SentinelServer, what: str, ports: set[int]) -> None:
        known = sentinel.instances(what)
        missing = {p for p in ports if p not in known or known[p] & _DOWN_FLAGS}
        if missing:
            raise NotYet(f"Sentinel {sentinel.port}: {what} {sorted(missing)} unknown or down")
