"""`rsched dlq`: list and replay dead-lettered runs."""

from __future__ import annotations

import click

from rsched.cli._output import JSON_FLAG, more, print_json, table
from rsched.cli.context import client_of
from rsched.core import defaults
from rsched.service import reads as query
from rsched.service.shapes import dead_letter_json


@click.group()
def dlq() -> None:
    """Dead-lettered runs."""


@dlq.command("list")
@click.option("--limit", default=defaults.PAGE_LIMIT, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def dlq_list(ctx: click.Context, limit: int, cursor: str | None, as_json: bool) -> None:
    """Dead letters, newest first."""
    c = client_of(ctx)
    page = c.run(query.op_dead_letter_page(c, limit, cursor))
    items = [dead_letter_json(d) for d in page.items]
    if as_json:
        print_json({"deadLetters": items, "nextCursor": page.next_cursor})
        return
    click.echo(table(["run", "type", "attempt", "dead at", "error"],
                     [[d["runId"], d["type"], d["attempt"], d["deadAt"], d["error"]]
                      for d in items]))
    more(page.next_cursor, "rsched dlq list")


@dlq.command("replay")
@click.argument("run_id")
@click.pass_context
def dlq_replay(ctx: click.Context, run_id: str) -> None:
    """Send a dead letter back for a new round of attempts."""
    run = client_of(ctx).replay(run_id)
    click.echo(f"{run.id} {run.state.value}")
