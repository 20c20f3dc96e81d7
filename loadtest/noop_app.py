"""No-op handlers for the engine benchmark: measures rsched, not the jobs."""

from rsched import App

app = App("bench")


@app.job("noop")
async def noop(ctx):  # type: ignore[no-untyped-def]
    return None
