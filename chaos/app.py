"""The handlers the checker's workers run (`rsched worker --app chaos.app:app`).

Each records its execution in the sink (chaos.sink) before and after its work.  quick: no work;
slow: sleeps longer than the visibility timeout, so only heartbeats keep it its worker's; flaky:
fails its first ``payload["fail"]`` attempts; tick: the recurring jobs' handler.
"""

from __future__ import annotations

import time
from typing import Any

from rsched import App, JobContext

from .sink import SinkWriter

app = App("chaos")
sink = SinkWriter()


class FlakyFailure(Exception):
    """A flaky handler's planned failure."""


def _run(ctx: JobContext, work_s: float = 0.0, fail: bool = False) -> dict[str, Any]:
    exec_id = sink.start(ctx.run_id, ctx.attempt, ctx.worker_id)
    if work_s:
        time.sleep(work_s)
    sink.finish(exec_id, ctx.run_id, ctx.attempt, ctx.worker_id, ok=not fail)
    if fail:
        raise FlakyFailure(f"attempt {ctx.attempt} fails on purpose")
    return {"attempt": ctx.attempt}


@app.job("quick")
def quick(ctx: JobContext) -> dict[str, Any]:
    return _run(ctx)


@app.job("slow")
def slow(ctx: JobContext) -> dict[str, Any]:
    return _run(ctx, work_s=float(ctx.payload["s"]))


@app.job("flaky")
def flaky(ctx: JobContext) -> dict[str, Any]:
    return _run(ctx, fail=ctx.attempt <= int(ctx.payload["fail"]))


@app.job("tick")
def tick(ctx: JobContext) -> dict[str, Any]:
    return _run(ctx)
