"""`rsched operations`: background operations (dead-letter purges), as GET /operations shows
them; `cancel` stops one at its next chunk."""

from __future__ import annotations

from typing import Any

import click

from rsched.cli._output import JSON_FLAG, PAGE_FLAGS, more, naming_flags, print_json, show, table
from rsched.cli.context import client_of
from rsched.cli.dead_letters import CLI_ACTOR
from rsched.core import defaults
from rsched.service import operations as ops
from rsched.service.shapes import operation_json


def _render(o: dict[str, Any]) -> str:
    done = o["deleted"] if not o["dryRun"] else o["matched"]
    lines = [f"{o['id']}  {o['kind']}{' (dry run)' if o['dryRun'] else ''}  {o['status']}",
             f"  filter: {o['filter'] or 'every dead letter'}",
             f"  read {o['scanned']} of {o['total']}, "
             f"{'matched' if o['dryRun'] else 'deleted'} {done}",
             f"  started {o['createdAt']} by {o['who']}, ended {o['endedAt'] or '-'}"]
    if o["error"]:
        lines.append(f"  error: {o['error']}")
    if o["cancelledBy"]:
        lines.append(f"  cancelled by {o['cancelledBy']}")
    return "\n".join(lines)


@click.group()
def operations() -> None:
    """Background operations: dead-letter purges and their progress."""


@operations.command("list")
@click.option("--limit", default=defaults.PAGE_LIMIT, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def operations_list(ctx: click.Context, limit: int, cursor: str | None, as_json: bool) -> None:
    """Operations, newest first (kept 7 days after they end)."""
    with naming_flags(PAGE_FLAGS):
        found, nxt = client_of(ctx).run(ops.op_list_operations(limit, cursor))
    items = [operation_json(o) for o in found]
    if as_json:
        print_json({"operations": items, "nextCursor": nxt})
        return
    click.echo(table(["id", "kind", "status", "read", "total", "matched", "deleted", "started"],
                     [[o["id"], o["kind"] + (" (dry)" if o["dryRun"] else ""), o["status"],
                       o["scanned"], o["total"], o["matched"], o["deleted"], o["createdAt"]]
                      for o in items]))
    more(nxt, "rsched operations list")


@operations.command("show")
@click.argument("operation_id")
@JSON_FLAG
@click.pass_context
def operations_show(ctx: click.Context, operation_id: str, as_json: bool) -> None:
    """One operation and its progress."""
    op_id = ops.check_operation_id(operation_id)
    show(operation_json(client_of(ctx).run(ops.op_get_operation(op_id))), as_json, _render)


@operations.command("cancel")
@click.argument("operation_id")
@JSON_FLAG
@click.pass_context
def operations_cancel(ctx: click.Context, operation_id: str, as_json: bool) -> None:
    """Stop a running operation at its next chunk; what it did stays done."""
    op_id = ops.check_operation_id(operation_id)
    op = client_of(ctx).run(ops.op_cancel_operation(op_id, CLI_ACTOR))
    show(operation_json(op), as_json, _render)
