"""Two apps with different handlers, for workers that share one queue (test_shared_queues):
each handler returns the id of the worker that ran it."""

from __future__ import annotations

from rsched import App, JobContext

alpha = App("alpha")
beta = App("beta")


@alpha.job("alpha")
def run_alpha(ctx: JobContext) -> str:
    return ctx.worker_id


@alpha.job("flaky")
def flaky(ctx: JobContext) -> str:
    if ctx.attempt == 1:
        raise RuntimeError("flaky: the first attempt fails")
    return ctx.worker_id


@beta.job("beta")
def run_beta(ctx: JobContext) -> str:
    return ctx.worker_id
