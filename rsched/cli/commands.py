"""Operator commands of the `rsched` CLI: status, preview, doctor, jobs, dlq, keys.

They talk to Redis through the same service layer as the HTTP API (rsched.service), and print
the same JSON shapes with ``--json`` (rsched.service.shapes), tables otherwise; they never import
rsched.api.  Errors reach `rsched.cli.main`, which prints one line to stderr and exits non-zero.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from rsched.archive.stats import duration_stats, failures
from rsched.archive.store import Store
from rsched.cli.context import client_of
from rsched.core.errors import ValidationError
from rsched.core.times import ms_to_iso, to_ms
from rsched.core.views import Status
from rsched.service import apikeys as auth
from rsched.service import reads as query
from rsched.service.inputs import spec_from_json
from rsched.service.shapes import (
    dead_letter_json,
    durations_json,
    failures_json,
    finding_json,
    job_json,
    key_json,
    runs_json,
    status_json,
)
from rsched.service.status import op_status

JSON_FLAG = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


_client = client_of


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain left-aligned columns; None prints as '-'."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _more(cursor: str | None, command: str) -> None:
    if cursor:
        click.echo(f"more: {command} --cursor {cursor}", err=True)


def _show(value: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    if as_json:
        _print_json(value)
    else:
        click.echo(render(value))


# --- status, preview, doctor -------------------------------------------------------------------


@click.command()
@JSON_FLAG
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Partitions, dispatchers, workers, queue depths and dead letters."""
    c = _client(ctx)
    s = c.run(op_status(c))
    if as_json:
        _print_json(status_json(s))
    else:
        click.echo(_render_status(s))


def _render_status(s: Status) -> str:
    parts = table(["partition", "owner", "lease until", "fence", "due", "retry", "oldest due ms",
                   "dead"],
                  [[p.partition, p.owner, ms_to_iso(p.lease_expires_ms), p.fence, p.due_backlog,
                    p.retry_backlog, p.oldest_due_age_ms, p.dead_letters]
                   for p in s.partitions])
    disp = table(["dispatcher", "expires", "partitions"],
                 [[d.id, ms_to_iso(d.expires_ms), ",".join(map(str, d.partitions))]
                  for d in s.dispatchers])
    work = table(["worker", "queues", "inflight", "last heartbeat", "alive"],
                 [[w.id, ",".join(w.queues), w.inflight, ms_to_iso(w.last_heartbeat_ms),
                   "yes" if w.alive else "NO"] for w in s.workers])
    queues = table(["queue", "length", "pending"],
                   [[q.queue, q.length, q.pending] for q in s.queues])
    head = (f"{ms_to_iso(s.now_ms)}  due backlog {s.due_backlog}  dead letters "
            f"{s.dead_letters}  dispatchers {len(s.dispatchers)}  workers {len(s.workers)}")
    return "\n\n".join([head, parts, disp, work, queues])


@click.command()
@click.argument("cron")
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone.")
@click.option("--from", "start", default=None, help="ISO-8601 start (exclusive); default now.")
@click.option("--count", default=5, show_default=True, type=int)
@JSON_FLAG
def preview(cron: str, tz: str, start: str | None, count: int, as_json: bool) -> None:
    """Print the next fire times of CRON in a zone, with the DST rules applied."""
    from_ms = int(time.time() * 1000) if start is None else to_ms(start, "--from")
    times = query.preview(cron, tz, from_ms, count)
    _show(times, as_json, lambda ts: table(["utc", "local"], [[t["utc"], t["local"]] for t in ts]))


@click.command()
@JSON_FLAG
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check Redis: version, eviction policy, AOF and fsync, partition count."""
    c = _client(ctx)
    findings = query.doctor(c.run(query.op_redis_facts()), c.settings.partitions)
    rows = [finding_json(f) for f in findings]
    _show(rows, as_json, lambda rs: table(["check", "level", "message"],
                                          [[r["check"], r["level"].upper(), r["message"]]
                                           for r in rs]))
    if any(f.level == "fail" for f in findings):
        sys.exit(1)


# --- jobs --------------------------------------------------------------------------------------


@click.group()
def jobs() -> None:
    """Schedule, inspect and control jobs."""


@jobs.command("add")
@click.option("--type", "job_type", required=True, help="Registered handler name.")
@click.option("--payload", default=None, help="JSON payload.")
@click.option("--run-at", default=None, help="ISO-8601 time for a one-off job (default now).")
@click.option("--cron", default=None, help="Cron expression for a recurring job.")
@click.option("--tz", default=None, help="IANA time zone of the cron expression.")
@click.option("--queue", default=None)
@click.option("--max-attempts", type=int, default=None)
@click.option("--priority", type=int, default=None)
@click.option("--idempotency-key", default=None)
@JSON_FLAG
@click.pass_context
def jobs_add(ctx: click.Context, job_type: str, payload: str | None, run_at: str | None,
             cron: str | None, tz: str | None, queue: str | None, max_attempts: int | None,
             priority: int | None, idempotency_key: str | None, as_json: bool) -> None:
    """Schedule a job and print its id."""
    try:
        body = json.loads(payload) if payload is not None else None
    except ValueError as e:
        raise ValidationError("--payload", f"not JSON: {e}") from None
    spec = spec_from_json({
        "type": job_type, "payload": body, "runAt": run_at, "cron": cron, "timeZone": tz,
        "queue": queue, "maxAttempts": max_attempts, "priority": priority,
        "idempotencyKey": idempotency_key,
    })
    job = _client(ctx).schedule_many([spec])[0]
    if isinstance(job, Exception):
        raise job
    _show(job_json(job), as_json, lambda j: j["id"])


def _render_job(j: dict[str, Any]) -> str:
    rows = [[k, json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v]
            for k, v in j.items()]
    return table(["field", "value"], rows)


@jobs.command("show")
@click.argument("job_id")
@JSON_FLAG
@click.pass_context
def jobs_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job."""
    _show(job_json(_client(ctx).get(job_id)), as_json, _render_job)


@jobs.command("list")
@click.option("--status", default=None, help="scheduled, paused, cancelled, completed, dead.")
@click.option("--type", "job_type", default=None)
@click.option("--queue", default=None)
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--cursor", default=None, help="From the previous page's 'more:' line.")
@JSON_FLAG
@click.pass_context
def jobs_list(ctx: click.Context, status: str | None, job_type: str | None, queue: str | None,
              limit: int, cursor: str | None, as_json: bool) -> None:
    """List jobs (SCAN-based: see rsched.query for the cost)."""
    c = _client(ctx)
    page = c.run(query.op_list_jobs(status=status, type=job_type, queue=queue, limit=limit,
                                    cursor=cursor))
    items = [job_json(j) for j in page.items]
    if as_json:
        _print_json({"jobs": items, "nextCursor": page.next_cursor})
        return
    click.echo(table(["id", "type", "queue", "status", "next run", "schedule"],
                     [[j["id"], j["type"], j["queue"], j["status"], j["nextRunAt"],
                       f"{j['cron']} ({j['timeZone']})" if j["cron"] else j["runAt"]]
                      for j in items]))
    _more(page.next_cursor, "rsched jobs list")


@jobs.command("runs")
@click.argument("job_id")
@click.option("--limit", default=20, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def jobs_runs(ctx: click.Context, job_id: str, limit: int, cursor: str | None,
              as_json: bool) -> None:
    """A job's attempts, newest first (with RSCHED_ARCHIVE_URL: its whole archived history)."""
    c = _client(ctx)
    body = runs_json(c.run(c.runs_source.op_page(job_id, limit, cursor)))
    items = body["runs"]
    if as_json:
        _print_json(body)
        return
    if body.get("partial"):
        click.echo("partial: more events wait in Redis than one read scans; older attempts "
                   "may be missing", err=True)
    click.echo(table(["run", "attempt", "status", "worker", "scheduled", "started", "ms",
                      "error"],
                     [[a["runId"], a["attempt"], a["status"], a["worker"], a["scheduledAt"],
                       a["startedAt"], a["durationMs"], a["error"]] for a in items]))
    _more(body["nextCursor"], f"rsched jobs runs {job_id}")


def _control(name: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("job_id")
    @click.pass_context
    def command(ctx: click.Context, job_id: str) -> None:
        job = getattr(_client(ctx), name)(job_id)
        click.echo(f"{job.id} {job.status.value}")

    return command


for _name, _doc in (("pause", "Pause a job; a run in progress finishes."),
                    ("resume", "Resume a paused job (a cron job from now)."),
                    ("cancel", "Cancel a job for good; a run in progress finishes.")):
    jobs.add_command(_control(_name, _doc))


@jobs.command("trigger")
@click.argument("job_id")
@click.pass_context
def jobs_trigger(ctx: click.Context, job_id: str) -> None:
    """Run a job once now, outside its schedule; prints the run id."""
    click.echo(_client(ctx).trigger(job_id))


# --- dead letters ------------------------------------------------------------------------------


@click.group()
def dlq() -> None:
    """Dead-lettered runs."""


@dlq.command("list")
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def dlq_list(ctx: click.Context, limit: int, cursor: str | None, as_json: bool) -> None:
    """Dead letters, newest first."""
    c = _client(ctx)
    page = c.run(query.op_dead_letter_page(c, limit, cursor))
    items = [dead_letter_json(d) for d in page.items]
    if as_json:
        _print_json({"deadLetters": items, "nextCursor": page.next_cursor})
        return
    click.echo(table(["run", "type", "attempt", "dead at", "error"],
                     [[d["runId"], d["type"], d["attempt"], d["deadAt"], d["error"]]
                      for d in items]))
    _more(page.next_cursor, "rsched dlq list")


@dlq.command("replay")
@click.argument("run_id")
@click.pass_context
def dlq_replay(ctx: click.Context, run_id: str) -> None:
    """Send a dead letter back for a new round of attempts."""
    run = _client(ctx).replay(run_id)
    click.echo(f"{run.id} {run.state.value}")


# --- API keys ----------------------------------------------------------------------------------


@click.group()
def keys() -> None:
    """API keys for the HTTP API."""


@keys.command("create")
@click.option("--scope", required=True, type=click.Choice(auth.SCOPES))
@click.option("--name", required=True, help="Who or what uses the key.")
@click.pass_context
def keys_create(ctx: click.Context, scope: str, name: str) -> None:
    """Create a key; prints its secret once (only a hash is stored)."""
    key, secret = _client(ctx).run(auth.op_create_key(name, scope))
    click.echo(f"created {key.id} ({key.name}, scope {key.scope}); the secret is shown once:",
               err=True)
    click.echo(secret)


@keys.command("list")
@JSON_FLAG
@click.pass_context
def keys_list(ctx: click.Context, as_json: bool) -> None:
    """List keys (never their secrets)."""
    items = [key_json(k) for k in _client(ctx).run(auth.op_list_keys())]
    _show(items, as_json, lambda ks: table(["id", "name", "scope", "created"],
                                           [[k["id"], k["name"], k["scope"], k["createdAt"]]
                                            for k in ks]))


@keys.command("revoke")
@click.argument("key")
@click.pass_context
def keys_revoke(ctx: click.Context, key: str) -> None:
    """Revoke a key by id (or by name, if unique)."""
    k = _client(ctx).run(auth.op_revoke_key(key))
    click.echo(f"revoked {k.id} ({k.name})")


# --- run statistics (the archive) ----------------------------------------------------------------


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
    store = _client(ctx).archive
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
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def stats_failures(ctx: click.Context, job_type: str | None, start: str | None,
                   end: str | None, limit: int, cursor: str | None, as_json: bool) -> None:
    """Failed, timed-out and abandoned attempts in a time range, newest first."""
    lo, hi = _range(start, end)
    body = failures_json(failures(_archive(ctx), job_type, lo, hi, limit, cursor))
    if as_json:
        _print_json(body)
        return
    click.echo(table(["at", "run", "attempt", "status", "type", "worker", "error"],
                     [[f["at"], f["runId"], f["attempt"], f["status"], f["type"], f["worker"],
                       f["error"]] for f in body["failures"]]))
    _more(body["nextCursor"], "rsched stats failures")


@stats.command("durations")
@_stats_options
@JSON_FLAG
@click.pass_context
def stats_durations(ctx: click.Context, job_type: str | None, start: str | None,
                    end: str | None, as_json: bool) -> None:
    """Duration percentiles (nearest rank, ms) per job type in a time range."""
    lo, hi = _range(start, end)
    rows = durations_json(duration_stats(_archive(ctx), lo, hi, job_type))
    _show(rows, as_json, lambda rs: table(
        ["type", "count", "failed", "mean ms", "p50", "p90", "p95", "p99", "max ms"],
        [[d["type"], d["count"], d["failed"], round(d["meanMs"], 1),
          *(d["percentiles"][q] for q in ("p50", "p90", "p95", "p99")), d["maxMs"]]
         for d in rs]))


COMMANDS: list[click.Command] = [status, preview, doctor, jobs, dlq, keys, stats]
