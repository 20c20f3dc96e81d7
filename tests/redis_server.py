"""Real `redis-server` processes for tests: plain, AOF and 3-master cluster, on free ports."""

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

__all__ = ["RedisCluster", "RedisServer", "RedisServerError", "free_port"]

HOST = "127.0.0.1"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1


class RedisServerError(RuntimeError):
    """The server did not come up (or went away); the message carries its log."""


def free_port() -> int:
    """A port free on 127.0.0.1, below Linux's ephemeral range so no client socket takes it."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
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


class RedisCluster:
    """Three masters, no replicas, every slot assigned; cluster_state:ok once start() returns."""

    def __init__(self, masters: int = 3, *, extra_args: Sequence[str] = ()) -> None:
        if masters < 3:
            raise ValueError(f"masters: redis-cli --cluster create needs 3, got {masters}")
        self.nodes = [RedisServer(extra_args=extra_args) for _ in range(masters)]
        for node in self.nodes:
            node.extra_args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(node.dir / "nodes.conf"),
                "--cluster-node-timeout", "5000",
                "--cluster-port", str(free_port()),
            ]  # fmt: skip
        self._clients: list[RedisClusterClient] = []

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(HOST, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """Any one node: a cluster client discovers the others from it."""
        return self.nodes[0].url

    def client(self, **kwargs: Any) -> RedisClusterClient:
        client = RedisClusterClient(startup_nodes=self.startup_nodes, **kwargs)
        self._clients.append(client)
        return client

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        cmd = ["redis-cli", "--cluster", "create", *addresses]
        cmd += ["--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RedisServerError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        self._wait_ok()
        return self

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(self.nodes)
        while pending:
            node = pending[0]
            with redis.Redis(host=HOST, port=node.port, decode_responses=True) as probe:
                info = probe.execute_command("CLUSTER", "INFO")
            if "cluster_state:ok" in info:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RedisServerError(node._message(f"cluster not ok:\n{info}"))
            time.sleep(0.05)

    def stop(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
