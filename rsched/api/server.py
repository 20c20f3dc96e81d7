"""The HTTP server `rsched api` runs: uvicorn with httptools, bounded before any key is checked.

uvicorn bounds idle keep-alive (``timeout_keep_alive``) but, with httptools, neither the size
nor the count of a request's headers, nor how long a client may take to send them or its body,
nor how many connections are open.  `BoundedHttpTools` adds those bounds to uvicorn's httptools
protocol, through the parser's callbacks (httptools' interface) and the connection's events:

- a request head (request line and headers) over ``max_head_bytes`` or with more than
  ``max_headers`` header lines is answered 431 and the connection closed, while it arrives: the
  parser keeps a header it has not finished in memory, so the bytes are counted as they come;
- a head not complete ``head_timeout_s`` after its first byte (or after the connection opened)
  is answered 408; so is a body not complete ``body_timeout_s`` after its head;
- a connection beyond ``max_connections`` open ones is answered 503 and closed at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rsched.api.browser import SECURITY_HEADERS
from rsched.core import defaults


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one client may hold of the server (defaults in rsched.core.defaults)."""

    max_head_bytes: int = defaults.MAX_HEAD_BYTES
    max_headers: int = defaults.MAX_HEADERS
    head_timeout_s: float = defaults.HEAD_TIMEOUT_S
    body_timeout_s: float = defaults.BODY_TIMEOUT_S
    keep_alive_s: int = defaults.KEEP_ALIVE_S
    max_connections: int = defaults.MAX_CONNECTIONS


def _answer(status: int, reason: str, detail: str) -> bytes:
    """A complete problem+json response that closes the connection, written without the app."""
    body = (f'{{"type":"about:blank","title":"{reason}","status":{status},'
            f'"detail":"{detail}"}}').encode()
    headers = b"".join(b"%s: %s\r\n" % h for h in SECURITY_HEADERS)
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n").encode() + headers \
        + b"\r\n" + body


_HEAD, _BODY = 1, 2  # what a connection's deadline is for
SWEEP_S = 0.5  # how often deadlines are checked: a timeout fires up to this late


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of `ServerLimits` (``LIMITS``, set by
    `protocol`).  A deadline is a number kept on the connection, checked for every connection
    by one sweep every SWEEP_S, not a timer per request (two per request, each made and
    cancelled, a visible share of the API's CPU per request)."""

    LIMITS = ServerLimits()
    _sweeping: asyncio.TimerHandle | None = None  # one sweep per protocol class (per server)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes received while the head was incomplete, counted per read
        self._chunk = 0  # the size of the read being parsed
        self._in_head = False
        self._refused = False
        self._deadline = 0.0  # loop time; 0: none
        self._waiting_for = 0  # _HEAD or _BODY

    # --- deadlines ---------------------------------------------------------------------------

    def _expect(self, what: int) -> None:
        limits = self.LIMITS
        self._deadline = self.loop.time() + (limits.head_timeout_s if what == _HEAD
                                             else limits.body_timeout_s)
        self._waiting_for = what

    @classmethod
    def _sweep(cls, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        now = loop.time()
        for conn in list(connections):
            if isinstance(conn, BoundedHttpTools) and 0 < conn._deadline <= now:
                conn._expired()
        cls._sweeping = loop.call_later(SWEEP_S, cls._sweep, loop, connections)

    def _expired(self) -> None:
        limits = self.LIMITS
        if self._waiting_for == _HEAD:
            detail = f"request head not complete within {limits.head_timeout_s:g} s"
        else:
            detail = f"request body not complete within {limits.body_timeout_s:g} s"
        quiet = not self._in_head and self._head_bytes == 0 and self.cycle is None
        self._refuse(408, "Request Timeout", detail, quiet=quiet)

    def _refuse(self, status: int, reason: str, detail: str, *, quiet: bool = False) -> None:
        """Answer ``status`` unless a response has begun, and close the connection."""
        self._deadline = 0.0
        if self._refused or self.transport.is_closing():
            return
        self._refused = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() answers http.disconnect from now on
            cycle.message_event.set()
        if not quiet and (cycle is None or not cycle.response_started):
            self.transport.write(_answer(status, reason, detail))
        self.transport.close()

    # --- connection events -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cls = type(self)
        if cls._sweeping is None:
            cls._sweeping = self.loop.call_later(SWEEP_S, cls._sweep, self.loop, self.connections)
        limits = self.LIMITS
        if len(self.connections) > limits.max_connections:
            self._refuse(503, "Service Unavailable",
                         f"over {limits.max_connections} open connections; try again later")
            return
        self._expect(_HEAD)  # the first request's head time runs from the connection's start

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline = 0.0
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._chunk = len(data)
        super().data_received(data)
        if self._in_head and not self._refused:
            # Counted as it arrives: the parser keeps a header it has not finished to itself.
            self._head_bytes += len(data)
            detail = self._over(self._head_bytes, len(self.headers))
            if detail is not None:
                self._refuse(431, "Request Header Fields Too Large", detail)

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read (an empty Transfer-Encoding, a bad request line):
        answered problem+json like every other answer, not uvicorn's text/plain; a callback
        that refused the request has answered already."""
        self._refuse(400, "Bad Request", "not a valid HTTP/1.1 request")

    # --- parser callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        if not self._deadline:
            self._expect(_HEAD)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_bytes + self._chunk > self.LIMITS.max_head_bytes \
                or len(self.headers) > self.LIMITS.max_headers:
            # Possibly over: measured exactly, from what the parser gave.
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            detail = self._over(size, len(self.headers))
            if detail is not None:
                self._refuse(431, "Request Header Fields Too Large", detail)
                raise _Refused(detail)  # stops the parser
        self._expect(_BODY)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._deadline = 0.0
        super().on_message_complete()

    def _over(self, size: int, count: int) -> str | None:
        """What of a head is over its limits, if anything."""
        limits = self.LIMITS
        if count > limits.max_headers:
            return f"more than {limits.max_headers} header lines"
        if size > limits.max_head_bytes:
            return f"request line and headers over {limits.max_head_bytes} bytes"
        return None


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request that was just refused."""


def protocol(limits: ServerLimits) -> type[BoundedHttpTools]:
    """The protocol class uvicorn is given, bound to ``limits``."""

    class Bounded(BoundedHttpTools):
        LIMITS = limits

    return Bounded


def serve(app: Any, host: str, port: int, limits: ServerLimits, **options: Any) -> None:
    """Run ``app`` under uvicorn with ``limits`` until SIGINT or SIGTERM."""
    import uvicorn

    # ws="none": the API has no WebSocket route, and an upgraded connection would leave the
    # bounds above behind.
    uvicorn.run(app, host=host, port=port, http=protocol(limits), ws="none",
                timeout_keep_alive=limits.keep_alive_s, **options)


__all__ = ["BoundedHttpTools", "ServerLimits", "protocol", "serve"]
