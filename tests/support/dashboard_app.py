"""The app the dashboard test's worker process loads
(`rsched worker --app support.dashboard_app:app`).

``gated`` fails while the file its payload names exists, so a test decides from outside when a
dead-lettered run will succeed on replay.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rsched import App, JobContext

app = App("dashboard-test")


@app.job("tick")
def tick(ctx: JobContext) -> dict[str, Any]:
    return {"attempt": ctx.attempt}


@app.job("gated")
def gated(ctx: JobContext) -> str:
    gate = ctx.payload["gate"]
    if os.path.exists(gate):
        raise RuntimeError(f"gate {gate} is closed")
    return "passed"


@app.job("stepped")
def stepped(ctx: JobContext) -> str:
    """Reports each of its payload's ``steps`` as progress once the file ``<gate>-<i>`` is gone,
    then runs on while ``<gate>-<len(steps)>`` exists: a test moves it on step by step."""
    gate, steps = ctx.payload["gate"], ctx.payload["steps"]
    for i, value in enumerate([*steps, None]):
        while os.path.exists(f"{gate}-{i}"):
            time.sleep(0.05)
        if value is not None:
            ctx.progress(value, f"step {i + 1}")
    return "done"
