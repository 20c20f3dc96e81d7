"""Handlers for the engine benchmarks: "noop" measures rsched, not the jobs; "incr" is the peer
benchmark's body (../shared/peer-bench: one INCR on the handler's own redis.asyncio connection),
for figures comparable with it (loadtest/bench_phases.py --body incr)."""

import os

import redis.asyncio as aredis

from rsched import App

app = App("bench")
_body: aredis.Redis | None = None  # made in the worker's event loop, at the first run


@app.job("noop")
async def noop(ctx):  # type: ignore[no-untyped-def]
    return None


@app.job("incr")
async def incr(ctx):  # type: ignore[no-untyped-def]
    global _body
    if _body is None:
        _body = aredis.Redis.from_url(os.environ["RSCHED_REDIS_URL"])
    await _body.incr("bench:body")
