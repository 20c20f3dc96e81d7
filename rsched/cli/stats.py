"""`rsched stats`: failures and durations read from the run-history archive."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from rsched.archive.stats import duration_stats, failures
from rsched.archive.store import Store
from rsched.cli._output import JSON_FLAG, PAGE_FLAGS, more, naming_flags, print_json, show, table
from rsched.cli.context import client_of
from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.times import to_ms
from rsched.service.shapes import durations_json, failures_json


@click.group()
def stats() -> None:
    """Failures and durations from the run-history archive (RSCHED_ARCHIVE_URL)."""


def _range(start: str | None, end: str | None) -> tuple[int, int | None]:
    lo = int(time.time() * 1000) - 86_400_000 if start is None else to_ms(start, "--from")
    hi = None if end is None else to_ms(end, "--to")
    if hi is not None and lo >= hi:
        raise ValidationError("--from", "must be before --to")
    return lo, hi


def _archive(ctx: click.Context) -> Store:
    store = client_of(ctx, checked=False).archive
    if store is None:
        raise ValidationError("RSCHED_ARCHIVE_URL", "not set: the stats read the run-history "
                              "archive (postgresql://... or sqlite:///path)")
    return store


STATS_OPTIONS = [
    click.option("--type", "job_type", default=None, help="Only this job type."),
    click.option("--from", "start", default=None, help="ISO-8601 start; default 24 hours ago."),
    click.option("--to", "end", default=None, help="ISO-8601 end (exclusive); default none."),
]


def _stats_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(STATS_OPTIONS):
        f = option(f)
    return f


@stats.command("failures")
@_stats_options
@click.option("--limit", default=defaults.PAGE_LIMIT, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def stats_failures(ctx: click.Context, job_type: str | None, start: str | None,
                   end: str | None, limit: int, cursor: str | None, as_json: bool) -> None:
    """Failed, timed-out and abandoned attempts in a time range, newest first."""
    lo, hi = _range(start, end)
    with naming_flags(PAGE_FLAGS):
        body = failures_json(failures(_archive(ctx), job_type, lo, hi, limit, cursor))
    if as_json:
        print_json(body)
        return
    click.echo(table(["at", "run", "attempt", "status", "type", "worker", "error"],
                     [[f["at"], f["runId"], f["attempt"], f["status"], f["type"], f["worker"],
                       f["error"]] for f in body["failures"]]))
    more(body["nextCursor"], "rsched stats failures")


@stats.command("durations")
@_stats_options
@JSON_FLAG
@click.pass_context
def stats_durations(ctx: click.Context, job_type: str | None, start: str | None,
                    end: str | None, as_json: bool) -> None:
    """Duration percentiles (nearest rank, ms) per job type in a time range."""
    lo, hi = _range(start, end)
    rows = durations_json(duration_stats(_archive(ctx), lo, hi, job_type))
    show(rows, as_json, lambda rs: table(
        ["type", "count", "failed", "mean ms", "p50", "p90", "p95", "p99", "max ms"],
        [[d["type"], d["count"], d["failed"], round(d["meanMs"], 1),
          *(d["percentiles"][q] for q in ("p50", "p90", "p95", "p99")), d["maxMs"]]
         for d in rs]))
