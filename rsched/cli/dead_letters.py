"""`rsched dlq`: list, replay and delete dead-lettered runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from rsched.cli._output import (
    JSON_FLAG,
    PAGE_FLAGS,
    more,
    naming_flags,
    print_json,
    summary,
    table,
)
from rsched.cli.context import client_of
from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.ids import process_id
from rsched.service import dead_letters as dead_letter_ops
from rsched.service import operations
from rsched.service.listings import op_dead_letter_page
from rsched.service.shapes import dead_letter_json

CLI_ACTOR = "cli"  # who a deletion or cancel from the CLI is recorded as
_FLAGS = {"type": "--type", "queue": "--queue", "errorContains": "--error-contains",
          "olderThanSeconds": "--older-than"}


def filter_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The filters `dlq list` and `dlq purge` share, as GET /dead-letters has them."""
    for option in reversed([
        click.option("--type", "job_type", default=None,
                     help="Only dead letters of this job type."),
        click.option("--queue", default=None, help="Only dead letters of this queue."),
        click.option("--error-contains", default=None,
                     help="Only those whose last error contains this (case-insensitive)."),
        click.option("--older-than", type=click.FloatRange(min=0), default=None,
                     metavar="SECONDS", help="Only those dead-lettered at least this many "
                     "seconds ago."),
    ]):
        f = option(f)
    return f


def dead_filter(job_type: str | None, queue: str | None, error_contains: str | None,
                older_than: float | None) -> dead_letter_ops.DeadFilter | None:
    """The filter the flags give (None: no flag given); its errors name the flag."""
    if job_type is None and queue is None and error_contains is None and older_than is None:
        return None
    try:
        return dead_letter_ops.DeadFilter(job_type, queue, error_contains, older_than)
    except ValidationError as e:
        flag = _FLAGS.get(e.field, e.field)
        raise click.BadParameter(e.reason, param_hint=f"'{flag}'") from None


@click.group()
def dlq() -> None:
    """Dead-lettered runs."""


@dlq.command("list")
@filter_options
@click.option("--limit", default=defaults.PAGE_LIMIT, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def dlq_list(ctx: click.Context, job_type: str | None, queue: str | None,
             error_contains: str | None, older_than: float | None, limit: int,
             cursor: str | None, as_json: bool) -> None:
    """Dead letters, newest first; with filters, those matching all of them (a page may then
    be short, with a cursor for more)."""
    flt = dead_filter(job_type, queue, error_contains, older_than)
    c = client_of(ctx)
    with naming_flags(PAGE_FLAGS):
        page = c.run(op_dead_letter_page(c, limit, cursor, flt))
    items = [dead_letter_json(d) for d in page.items]
    if as_json:
        print_json({"deadLetters": items, "nextCursor": page.next_cursor})
        return
    click.echo(table(["run", "type", "attempt", "dead at", "error"],
                     [[d["runId"], d["type"], d["attempt"], d["deadAt"], summary(d["error"])]
                      for d in items]))
    more(page.next_cursor, "rsched dlq list")


@dlq.command("replay")
@click.argument("run_id")
@click.pass_context
def dlq_replay(ctx: click.Context, run_id: str) -> None:
    """Send a dead letter back for a new round of attempts."""
    run = client_of(ctx).replay(run_id)
    click.echo(f"{run.id} {run.state.value}")


@dlq.command("delete")
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN_ID...")
@click.pass_context
def dlq_delete(ctx: click.Context, run_ids: tuple[str, ...]) -> None:
    """Delete dead letters for good (recorded in each run's history as deleted by "cli").
    Exits 1 when one of them was not a dead letter."""
    c = client_of(ctx)
    deleted = c.run(dead_letter_ops.op_delete(c, run_ids, CLI_ACTOR))
    for run_id, ok in zip(run_ids, deleted, strict=True):
        if ok:
            click.echo(f"{run_id} deleted")
        else:
            click.echo(f"{run_id}: not a dead letter (replayed or deleted already?)", err=True)
    if not all(deleted):
        ctx.exit(1)


@dlq.command("purge")
@filter_options
@click.option("--dry-run", is_flag=True, help="Only count the dead letters that match.")
@JSON_FLAG
@click.pass_context
def dlq_purge(ctx: click.Context, job_type: str | None, queue: str | None,
              error_contains: str | None, older_than: float | None, dry_run: bool,
              as_json: bool) -> None:
    """Delete every dead letter matching all filters given (no filter: every dead letter).

    Runs here, in the foreground, as a background operation would (`rsched operations show`
    follows it); Ctrl-C cancels it, keeping what was deleted."""
    flt = dead_filter(job_type, queue, error_contains, older_than) or dead_letter_ops.DeadFilter()
    c = client_of(ctx)
    op = c.run(operations.op_start_purge(c, flt, dry_run, CLI_ACTOR))
    try:
        c.run(operations.op_run(c, op.id, process_id("cli")))
    except KeyboardInterrupt:
        c.run(operations.op_cancel_operation(op.id, CLI_ACTOR))
        raise
    op = c.run(operations.op_get_operation(op.id))
    count = op.matched if dry_run else op.deleted
    if as_json:
        print_json({"dryRun": dry_run, "count": count, "operation": op.id})
    elif dry_run:
        click.echo(f"{count} dead letter{'' if count == 1 else 's'} would be deleted")
    else:
        click.echo(f"{count} dead letter{'' if count == 1 else 's'} deleted")
    if op.status != "succeeded":
        raise click.ClickException(f"operation {op.id} {op.status}: {op.error or 'stopped'}")
