"""The app the dashboard test's worker process loads
(`rsched worker --app support.dashboard_app:app`).

``gated`` fails while the file its payload names exists, so a test decides from outside when a
dead-lettered run will succeed on replay.
"""

from __future__ import annotations

import os
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
