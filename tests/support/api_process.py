"""A real `rsched api` process on a free port, for tests that talk to it over raw sockets and
httpx: started with the given options, ready when /readyz answers, stopped after."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from rsched import Client
from rsched.core.settings import Settings
from rsched.service.apikeys import op_create_key
from support.processes import Proc, wait_for
from support.redis_server import free_port


@dataclass
class Api:
    port: int
    admin: str  # API key secrets
    read: str
    proc: Proc
    sockets: list[socket.socket] = field(default_factory=list)  # closed by close_sockets

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def http(self, key: str | None = None, **headers: str) -> httpx.Client:
        """A client of its own (closed by the caller), with ``key`` as Bearer token."""
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return httpx.Client(base_url=self.base, timeout=10, headers=headers)

    def connect(self, timeout_s: float = 30) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
        s.settimeout(timeout_s)
        self.sockets.append(s)
        return s

    def close_sockets(self) -> None:
        while self.sockets:
            self.sockets.pop().close()


def read_until_closed(s: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a reset ends it too)."""
    out = bytearray()
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return bytes(out)


def send_all(s: socket.socket, data: bytes) -> bool:
    """Send what the server will take: False when it closed the connection first."""
    try:
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        return False
    return True


@contextmanager
def running_api(redis_url: str, cwd: Path, *args: str, env: dict[str, str] | None = None,
                again: Api | None = None, log_level: str = "INFO") -> Iterator[Api]:
    """`rsched --log-level L api --port P *args` on an emptied Redis, with an admin and a read
    key; or, with ``again``, another API on the Redis as it is, with that one's keys."""
    if again is None:
        with redis.Redis.from_url(redis_url) as r:
            r.flushall()
        admin_client = Client(settings=Settings.from_env(redis_url=redis_url))
        _, admin = admin_client.run(op_create_key("http-admin", "admin"))
        _, read = admin_client.run(op_create_key("http-reader", "read"))
        admin_client.close()
    else:
        admin, read = again.admin, again.read
    port = free_port()
    full_env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1", **(env or {}))
    proc = Proc("api" if again is None else f"api-{port}",
                ["--log-level", log_level, "api", "--port", str(port), *args], full_env, cwd)
    api = Api(port, admin, read, proc)
    try:
        # A connection per check: a kept-alive one would count against --max-connections.
        # 421: up, and not answering 127.0.0.1 (--allowed-host).
        wait_for("api ready", lambda: httpx.get(f"{api.base}/readyz").status_code in (200, 421),
                 [proc])
        yield api
    finally:
        api.close_sockets()
        proc.stop()


def wait_closed(s: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """What the server sent before closing ``s``, and after how many seconds."""
    s.settimeout(timeout_s)
    start = time.monotonic()
    got = read_until_closed(s)
    return got, time.monotonic() - start


__all__ = ["Api", "read_until_closed", "running_api", "send_all", "wait_closed"]
