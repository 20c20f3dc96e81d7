"""A real HTTP server for HTTP target tests: aiohttp.web on a free 127.0.0.1 port, in a thread
of its own, recording every request it gets (method, path, headers, body, arrival time)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()


@dataclass
class Receiver:
    """Routes: /ok (200 'thanks'), /status/N (N, with Retry-After when ?retry_after= is given,
    and 200 from the (?fail=K)+1th call on), /hang (sleeps ?s= seconds on the first call, then
    200), /redirect?to=URL&code=N, /big (10 MiB streamed)."""

    port: int = 0
    received: list[Received] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def of(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.method, request.path, dict(request.headers),
                                      body, time.monotonic()))
        n = self.calls[request.path_qs] = self.calls.get(request.path_qs, 0) + 1
        q = request.query
        path = request.path
        if path == "/ok":
            return web.Response(text="thanks")
        if path.startswith("/status/"):
            if n > int(q.get("fail", "1000")):
                return web.Response(text="recovered")
            headers = {"Retry-After": q["retry_after"]} if "retry_after" in q else {}
            return web.Response(status=int(path.rsplit("/", 1)[1]), text="no", headers=headers)
        if path == "/hang":
            if n == 1:
                await asyncio.sleep(float(q.get("s", "30")))
            return web.Response(text="awake")
        if path == "/redirect":
            return web.Response(status=int(q.get("code", "302")), headers={"Location": q["to"]})
        if path == "/big":
            resp = web.StreamResponse()
            await resp.prepare(request)
            chunk = b"x" * 65536
            for _ in range(160):  # 10 MiB
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        return web.Response(status=404, text="unknown route")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A running Receiver, stopped after the test."""
    rec = Receiver()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", rec.handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        rec.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the receiver did not start"
    try:
        yield rec
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
