"""A small TCP proxy for fault tests: put it between a process and redis-server, then freeze the
connections (bytes are held, not lost, as on a stalled network path), thaw them, or drop them
(every connection reset at once, as when a NAT or a load balancer forgets them).

It runs in threads of the test process and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import Self

CHUNK = 65536
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


class TcpProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<upstream_port>."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._frozen = threading.Event()
        self._held = threading.Event()  # replies (server to client) not delivered
        self._hold_after: bytes | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        t = threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def freeze(self) -> None:
        """Hold every byte in both directions until thaw(); new connections are accepted but
        frozen too."""
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen.clear()

    def hold_replies_after(self, marker: bytes) -> None:
        """Deliver nothing more from the server once a client has sent ``marker`` (the request
        itself reaches the server): a reply lost after the command ran.  Until release()."""
        self._hold_after = marker

    def release(self) -> None:
        self._hold_after = None
        self._held.clear()

    def drop(self) -> None:
        """Reset every open connection (clients see a connection error on their next read)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.thaw()
        try:
            self._listener.close()
        except OSError:
            pass
        self.drop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, server))
                self.accepted += 1
            t = threading.Thread(target=self._pump, args=(client, server), daemon=True,
                                 name="tcp-proxy-pump")
            t.start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        """Copy bytes both ways; while frozen, stop reading (the kernel buffers fill, then the
        sender blocks), exactly like a path that stopped delivering."""
        sel = selectors.DefaultSelector()
        peer = {a: b, b: a}
        try:
            sel.register(a, selectors.EVENT_READ)
            sel.register(b, selectors.EVENT_READ)
            while not self._stop.is_set():
                if self._frozen.is_set():
                    self._stop.wait(0.01)
                    continue
                for key, _ in sel.select(timeout=0.05):
                    if self._frozen.is_set():  # frozen while select waited: deliver nothing
                        break
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    if src is b and self._held.is_set():
                        self._stop.wait(0.005)  # the reply stays in the kernel's buffer
                        continue
                    data = src.recv(CHUNK)
                    if not data:
                        return
                    peer[src].sendall(data)
                    if src is a and self._hold_after is not None and self._hold_after in data:
                        self._held.set()
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass
            with self._lock:
                self._pairs = [p for p in self._pairs if p != (a, b)]


@contextlib.contextmanager
def proxies_for(ports: Iterable[int]) -> Iterator[dict[int, TcpProxy]]:
    """A started proxy in front of each port (keyed by it), all closed at the end."""
    proxies: dict[int, TcpProxy] = {}
    try:
        for port in ports:
            proxies[port] = TcpProxy(port).start()
        yield proxies
    finally:
        for p in proxies.values():
            p.close()
