"""`rsched limits`: define, show, list and delete flow-control limits (docs/limits.md)."""

from __future__ import annotations

from typing import Any

import click

from rsched.cli._output import JSON_FLAG, naming_flags, show, table
from rsched.cli.context import client_of
from rsched.core.errors import ValidationError
from rsched.core.limits import limit_of, rate_of_text
from rsched.service import limits as limit_ops
from rsched.service.shapes import limit_json, limit_view_json, queue_limit_json

FLAGS = {"name": "NAME", "concurrency": "--concurrency", "rate": "--rate", "body": "NAME",
         "queue": "--queue"}
"""The flag each API field's error names."""


@click.group()
def limits() -> None:
    """Concurrency and rate limits per limit key (a name ending in '*' is a family), or of a
    whole queue (--queue Q instead of NAME)."""


QUEUE_OPTION = click.option("--queue", default=None,
                            help="The limit of this whole queue, instead of a NAME.")


def _target(name: str | None, queue: str | None) -> tuple[str, bool]:
    """(NAME or the queue, whether it is a queue): exactly one of them is given."""
    if (name is None) == (queue is None):
        raise ValidationError("name", "give NAME or --queue Q, one of them")
    return (queue, True) if queue is not None else (str(name), False)


def _rate(d: dict[str, Any]) -> str:
    r = d["rate"]
    return "-" if r is None else f"{r['limit']}/{r['periodSeconds']}s"


def _row(d: dict[str, Any]) -> list[Any]:
    conc = d["concurrency"]
    return [d["name"], "-" if conc is None else conc, _rate(d)]


@limits.command("set")
@click.argument("name", required=False)
@QUEUE_OPTION
@click.option("--concurrency", type=int, default=None, help="Runs of a key at once, at most.")
@click.option("--rate", default=None,
              help="Starts of a key per window, at most: N/<period>, e.g. 10/1s or 600/60s.")
@JSON_FLAG
@click.pass_context
def limits_set(ctx: click.Context, name: str | None, queue: str | None,
               concurrency: int | None, rate: str | None, as_json: bool) -> None:
    """Define or replace the limit NAME (or of the queue --queue Q); it applies at once."""
    with naming_flags(FLAGS):
        target, is_queue = _target(name, queue)
        body: dict[str, Any] = {"concurrency": concurrency, "rate": None}
        if rate is not None:
            n, seconds = rate_of_text(rate)
            body["rate"] = {"limit": n, "periodSeconds": seconds}
        c = client_of(ctx)
        if is_queue:
            limit = c.run(limit_ops.op_set_queue_limit(c, limit_ops.queue_limit_of(target, body)))
            shown = queue_limit_json(limit_ops.LimitView(limit))
        else:
            shown = limit_json(c.run(limit_ops.op_set_limit(c, limit_of(target, body))))
    what = f"queue {target}" if is_queue else target
    show(shown, as_json, lambda d: f"set {what}: concurrency "
         f"{'-' if d['concurrency'] is None else d['concurrency']}, rate {_rate(d)}")


@limits.command("list")
@JSON_FLAG
@click.pass_context
def limits_list(ctx: click.Context, as_json: bool) -> None:
    """List every limit by name."""
    items = [limit_json(lim) for lim in client_of(ctx).run(limit_ops.op_all_limits())]
    show(items, as_json, lambda ds: table(["name", "concurrency", "rate"],
                                           [_row(d) for d in ds]))


@limits.command("show")
@click.argument("name", required=False)
@QUEUE_OPTION
@JSON_FLAG
@click.pass_context
def limits_show(ctx: click.Context, name: str | None, queue: str | None, as_json: bool) -> None:
    """One limit; a key's own (or a queue's) with its runs in flight and waiting; its busiest
    keys."""
    c = client_of(ctx)
    with naming_flags(FLAGS):
        target, is_queue = _target(name, queue)
        if is_queue:
            qview = queue_limit_json(c.run(limit_ops.op_get_queue_limit(c, target)))
        else:
            view = limit_view_json(c.run(limit_ops.op_get_limit(c, target)))
    if is_queue:
        show(qview, as_json, lambda d: table(
            ["queue", "concurrency", "rate", "in flight", "waiting"],
            [[d["queue"], "-" if d["concurrency"] is None else d["concurrency"], _rate(d),
              d["inFlight"], d["waiting"]]]))
        return
    show(view, as_json, _view_text)


def _view_text(d: dict[str, Any]) -> str:
    text = table(["name", "concurrency", "rate", "in flight", "waiting"],
                 [[*_row(d), d.get("inFlight", "-"), d.get("waiting", "-")]])
    if d["busiestKeys"]:
        text += "\n\nbusiest keys\n" + table(
            ["key", "in flight", "waiting", "recent starts"],
            [[k["key"], k["inFlight"], k["waiting"], k["recentStarts"]] for k in d["busiestKeys"]])
    return text


@limits.command("delete")
@click.argument("name", required=False)
@QUEUE_OPTION
@click.pass_context
def limits_delete(ctx: click.Context, name: str | None, queue: str | None) -> None:
    """Delete the limit NAME (or of the queue --queue Q); its waiting runs start."""
    c = client_of(ctx)
    with naming_flags(FLAGS):
        target, is_queue = _target(name, queue)
        if is_queue:
            c.run(limit_ops.op_delete_queue_limit(c, target))
        else:
            c.run(limit_ops.op_delete_limit(c, target))
    click.echo(f"deleted {'queue limit ' if is_queue else ''}{target}")
