"""`rsched runs`: one run (show, wait for its end), and `rsched jobs watch`: a job's events as
they happen.  Both follow the partitions' events streams (rsched.service.run_events)."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from rsched.cli._output import JSON_FLAG, show, table
from rsched.cli.context import client_of
from rsched.core.models import RunState
from rsched.service.inputs import known_job_id
from rsched.service.run_events import ended, op_wait_run
from rsched.service.shapes import run_json

TIMED_OUT = 124  # `rsched runs wait`'s exit code when the run has not ended in time (timeout(1))


def _render_run(r: dict[str, Any]) -> str:
    rows = [[k, json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v]
            for k, v in r.items()]
    return table(["field", "value"], rows)


@click.group()
def runs() -> None:
    """One run of a job: show it, wait for its end."""


@runs.command("show")
@click.argument("run_id")
@JSON_FLAG
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show one run (its state, attempt, worker, times, error and result)."""
    show(run_json(client_of(ctx).get_run(run_id)), as_json, _render_run)


@runs.command("wait")
@click.argument("run_id")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Give up after this long (exit 124); default: wait as long as it takes.")
@JSON_FLAG
@click.pass_context
def runs_wait(ctx: click.Context, run_id: str, timeout: float | None, as_json: bool) -> None:
    """Wait for a run to end (also a job's next occurrence, not dispatched yet) and show it:
    exit 0 if it succeeded, 1 if it ended otherwise (dead-lettered, cancelled, skipped), 124
    if it had not ended within --timeout."""
    run = client_of(ctx).run(op_wait_run(run_id, math.inf if timeout is None else timeout))
    if run is None:  # its job's next occurrence, still not dispatched
        click.echo(f"run {run_id} has not been dispatched within {timeout:g} s", err=True)
        ctx.exit(TIMED_OUT)
    show(run_json(run), as_json, _render_run)
    if not ended(run):
        click.echo(f"run {run_id} has not ended within {timeout:g} s", err=True)
        ctx.exit(TIMED_OUT)
    if run.state is not RunState.SUCCEEDED:
        ctx.exit(1)


@click.command("watch")
@click.argument("job_id")
@JSON_FLAG
@click.pass_context
def jobs_watch(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Print each of the job's events as it happens (--json: one object a line), until
    interrupted."""
    c = client_of(ctx)
    c.get(known_job_id(job_id))  # an unknown job is an error, not a silent watch
    for ev in c.events(job_id):
        if as_json:
            click.echo(json.dumps(ev, ensure_ascii=False, separators=(",", ":")))
            continue
        detail = " ".join(f"{k}={ev[k]}" for k in ("runId", "attempt", "worker", "error")
                          if k in ev)
        click.echo(f"{ev['at']}  {ev['event']:<16} {detail}".rstrip())
