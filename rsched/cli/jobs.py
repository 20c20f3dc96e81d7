"""`rsched jobs`: schedule, inspect and control jobs through the service layer."""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import replace
from typing import Any

import click

from rsched.archive.store import SORTS
from rsched.cli._output import (
    JSON_FLAG,
    PAGE_FLAGS,
    more,
    naming_flags,
    print_json,
    show,
    summary,
    table,
)
from rsched.cli.context import client_of
from rsched.core import defaults
from rsched.core.errors import Conflict, ValidationError, VersionMismatch
from rsched.core.values import TOO_DEEP, VALUE_DEPTH
from rsched.core.views import WorkerStatus
from rsched.service.inputs import spec_from_json
from rsched.service.job_listing import JobFilter, op_job_listing
from rsched.service.last_runs import LAST_RUN_FILTERS, op_last_runs
from rsched.service.shapes import (
    backfill_json,
    created_json,
    job_json,
    last_run_json,
    listing_json,
    runs_json,
)
from rsched.service.status import op_workers

ADD_FLAGS = {"type": "--type", "payload": "--payload", "runAt": "--run-at", "cron": "--cron",
             "timeZone": "--tz", "queue": "--queue", "maxAttempts": "--max-attempts",
             "priority": "--priority", "idempotencyKey": "--idempotency-key",
             "misfire": "--misfire", "catchUpWindowSeconds": "--catch-up-window",
             "overlap": "--overlap", "startAt": "--start-at", "endAt": "--end-at",
             "maxRuns": "--max-runs", "pauseAfterFailures": "--pause-after-failures",
             "startDeadlineSeconds": "--start-deadline", "timeoutSeconds": "--timeout",
             "jitterSeconds": "--jitter", "paused": "--paused",
             "backoff.baseSeconds": "--backoff-base", "backoff.capSeconds": "--backoff-cap",
             "dedup.key": "--dedup-key", "dedup.ttlSeconds": "--dedup-ttl",
             "dedup.mode": "--dedup-mode", "limitKey": "--limit-key", "target.url": "--url",
             "target.method": "--method", "target.timeoutSeconds": "--http-timeout",
             "target": "--header"}
"""`jobs add`'s flags by the API field each sets: its errors name the flag."""


@click.group()
def jobs() -> None:
    """Schedule, inspect and control jobs."""


@jobs.command("add")
@click.option("--type", "job_type", default=None,
              help="Registered handler name (http, the default, with --url).")
@click.option("--payload", default=None, help="JSON payload.")
@click.option("--url", default=None,
              help="An HTTP target: the URL a worker started with --http calls at each run "
                   "(docs/http-targets.md).")
@click.option("--method", default=None, help="With --url: GET, POST (default), PUT, PATCH or "
                                             "DELETE.")
@click.option("--header", "headers", multiple=True, metavar="NAME:VALUE",
              help="With --url: a request header (repeatable).")
@click.option("--body", default=None,
              help="With --url: the JSON body to send (default: the payload).")
@click.option("--http-timeout", type=float, default=None,
              help="With --url: seconds per attempt for the request (default 30).")
@click.option("--run-at", default=None, help="ISO-8601 time for a one-off job (default now).")
@click.option("--cron", default=None, help="Cron expression for a recurring job.")
@click.option("--tz", default=None, help="IANA time zone of the cron expression.")
@click.option("--queue", default=None)
@click.option("--max-attempts", type=int, default=None)
@click.option("--priority", type=int, default=None)
@click.option("--idempotency-key", default=None)
@click.option("--misfire", default=None,
              help="run_once or skip: what happens to occurrences older than the window.")
@click.option("--catch-up-window", "catch_up", type=float, default=None,
              help="Seconds: occurrences missed by less than this all run (default 60).")
@click.option("--overlap", default=None,
              help="allow, skip, bufferOne or cancelPrevious: a recurring occurrence while "
                   "the last one runs.")
@click.option("--start-at", default=None, help="ISO-8601: no occurrence before it (cron).")
@click.option("--end-at", default=None,
              help="ISO-8601: no occurrence after it; the job then completes (cron).")
@click.option("--max-runs", type=int, default=None,
              help="The job completes after this many runs started (cron).")
@click.option("--pause-after-failures", type=int, default=None,
              help="Pause the job after this many dead-lettered occurrences in a row (cron).")
@click.option("--start-deadline", type=float, default=None,
              help="Seconds: a one-off job not started by --run-at plus this is "
                   "dead-lettered, never run late.")
@click.option("--timeout", type=float, default=None,
              help="Seconds an attempt may run before it is failed as timed out.")
@click.option("--backoff-base", type=float, default=None,
              help="Seconds before the first retry; doubled for each retry after it.")
@click.option("--backoff-cap", type=float, default=None,
              help="Seconds: the longest wait between two attempts.")
@click.option("--jitter", type=float, default=None,
              help="Seconds: each occurrence of a cron job is due within plus or minus this of its "
                   "time, by a fixed offset from the job id and the time.")
@click.option("--paused", is_flag=True, default=None, help="Create the job paused.")
@click.option("--dedup-key", default=None,
              help="Dedup window key: creates with this key within --dedup-ttl answer one job "
                   "(docs/dedup.md).")
@click.option("--dedup-ttl", type=float, default=None, help="Seconds the dedup window lasts.")
@click.option("--dedup-mode", default=None,
              help="ttl (default), untilDone or debounce: how the dedup window holds.")
@click.option("--limit-key", default=None,
              help="The key whose limit its runs count against (rsched limits set).")
@JSON_FLAG
@click.pass_context
def jobs_add(ctx: click.Context, job_type: str, payload: str | None, run_at: str | None,
             cron: str | None, tz: str | None, queue: str | None, max_attempts: int | None,
             priority: int | None, idempotency_key: str | None, misfire: str | None,
             catch_up: float | None, overlap: str | None, start_at: str | None,
             end_at: str | None, max_runs: int | None, pause_after_failures: int | None,
             start_deadline: float | None, timeout: float | None, backoff_base: float | None,
             backoff_cap: float | None, jitter: float | None, paused: bool | None,
             dedup_key: str | None, dedup_ttl: float | None, dedup_mode: str | None,
             limit_key: str | None, as_json: bool, url: str | None = None,
             method: str | None = None, headers: tuple[str, ...] = (), body: str | None = None,
             http_timeout: float | None = None) -> None:
    """Schedule a job and print its id (`jobs create` is the same command)."""
    value = _json_flag(payload, "--payload")
    target = None
    if url is not None:
        target = {"url": url, "method": method, "headers": _header_flags(headers),
                  "timeoutSeconds": http_timeout, "body": _json_flag(body, "--body")}
    else:
        for flag, given in (("--method", method), ("--header", headers), ("--body", body),
                            ("--http-timeout", http_timeout)):
            if given:
                raise ValidationError(flag, "applies to an HTTP target only (give --url)")
        if job_type is None:
            raise ValidationError("--type", "required: the name of a registered handler "
                                  "(or --url for an HTTP target)")
    c = client_of(ctx)
    with naming_flags(ADD_FLAGS):
        spec = spec_from_json({
            "type": job_type, "target": target, "payload": value, "runAt": run_at,
            "cron": cron, "timeZone": tz,
            "queue": queue, "maxAttempts": max_attempts, "priority": priority,
            "idempotencyKey": idempotency_key, "misfire": misfire,
            "catchUpWindowSeconds": catch_up, "overlap": overlap, "startAt": start_at,
            "endAt": end_at, "maxRuns": max_runs, "pauseAfterFailures": pause_after_failures,
            "startDeadlineSeconds": start_deadline, "timeoutSeconds": timeout,
            "jitterSeconds": jitter, "paused": paused, "limitKey": limit_key,
            "backoff": {"baseSeconds": backoff_base, "capSeconds": backoff_cap},
            "dedup": None if dedup_key is None and dedup_ttl is None and dedup_mode is None
            else {"key": dedup_key, "ttlSeconds": dedup_ttl, "mode": dedup_mode},
        })
        job = c.schedule_many([spec])[0]
        if isinstance(job, Exception):
            raise job
    show(created_json(job), as_json,
         lambda j: f"{j['id']} (deduplicated)" if j["deduplicated"] else j["id"])
    workers = c.run(op_workers(c))
    if not any(w.serves(job.type, job.queue) for w in workers):
        click.echo(handler_warning(job.type, job.queue, workers), err=True)


def _json_flag(text: str | None, flag: str) -> Any:
    """A flag's JSON value (None when not given), errors naming the flag."""
    try:
        return json.loads(text) if text is not None else None
    except ValueError as e:
        raise ValidationError(flag, f"not JSON: {e}") from None
    except RecursionError:
        raise ValidationError(flag, f"{TOO_DEEP}; the limit is {VALUE_DEPTH}") from None


def _header_flags(given: tuple[str, ...]) -> dict[str, str] | None:
    """--header NAME:VALUE flags as a dict (the value's surrounding blanks dropped)."""
    out: dict[str, str] = {}
    for h in given:
        name, sep, value = h.partition(":")
        if not sep:
            raise ValidationError("--header", f"{h!r}: expected NAME:VALUE")
        if name in out:
            raise ValidationError("--header", f"{name!r} given twice")
        out[name] = value.strip()
    return out or None


# `jobs create`: the same command under the name the HTTP target docs use (a copy, so that
# each name has its own usage line).
jobs_create = copy.copy(jobs_add)
jobs_create.name = "create"
jobs.add_command(jobs_create)


def handler_warning(job_type: str, queue: str, workers: list[WorkerStatus]) -> str:
    """What happens to a job no live worker has the handler for, as the workers on its queue
    will do it (docs/workers.md, "Job types and shared queues")."""
    start = f"start one: rsched worker --app ... --queues {queue}"
    waits = [w.handler_wait_ms or int(defaults.HANDLER_WAIT_S * 1000)
             for w in workers if w.alive and queue in w.queues]
    head = f"warning: no live worker has a handler for job type {job_type!r} on queue {queue!r}"
    if not waits:
        return f"{head}, and none reads that queue: the job waits there until one starts ({start})"
    return (f"{head}; the workers reading it set its runs aside unrun, and each run is "
            f"dead-lettered if none with that handler serves the queue within "
            f"{min(waits) / 1000:g} s (their --handler-wait; {start})")


def _render_job(j: dict[str, Any]) -> str:
    rows = [[k, json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v]
            for k, v in j.items()]
    return table(["field", "value"], rows)


@jobs.command("show")
@click.argument("job_id")
@JSON_FLAG
@click.pass_context
def jobsshow(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job, with its latest run and failure streak (as `jobs list` shows them)."""
    c = client_of(ctx)
    job = c.get(job_id)
    (last,) = c.run(op_last_runs([job]))
    show(dict(job_json(job), lastRun=last_run_json(last)), as_json, _render_job)


@jobs.command("list")
@click.option("--status", default=None, help="scheduled, paused, cancelled, completed, dead.")
@click.option("--type", "job_type", default=None)
@click.option("--queue", default=None)
@click.option("--last-run", type=click.Choice(LAST_RUN_FILTERS), default=None,
              help="Only jobs whose latest run is so (failed includes dead).")
@click.option("--search", default=None,
              help="Jobs whose id, type or idempotency key starts with this (needs the archive).")
@click.option("--sort", type=click.Choice(list(SORTS)), default=None,
              help="nextRun (soonest first), created (newest first, the default with a "
                   "filter) or lastRun (latest first); from the archive's job index.")
@click.option("--limit", default=defaults.PAGE_LIMIT, show_default=True, type=int)
@click.option("--cursor", default=None, help="From the previous page's 'more:' line.")
@JSON_FLAG
@click.pass_context
def jobs_list(ctx: click.Context, status: str | None, job_type: str | None, queue: str | None,
              last_run: str | None, search: str | None, sort: str | None, limit: int,
              cursor: str | None, as_json: bool) -> None:
    """List jobs, with each one's latest run and how many runs in a row failed.  With a
    filter, a search or a sort, from the archive's job index (RSCHED_ARCHIVE_URL): sorted,
    every page full; without an archive, by scanning every job in Redis (said on stderr)."""
    c = client_of(ctx)
    flt = JobFilter(status=status, type=job_type, queue=queue, last_run=last_run, q=search)
    with naming_flags({f: f"--{f}" for f in ("status", "type", "queue", "sort")} | PAGE_FLAGS
                      | {"lastRun": "--last-run", "q": "--search"}):
        page = c.run(op_job_listing(c, flt, sort=sort, limit=limit, cursor=cursor))
    if not page.indexed and (flt.given or sort):
        click.echo("note: no run-history archive (RSCHED_ARCHIVE_URL), so no job index: "
                   "listed by scanning every job in Redis, in no order; a page may hold "
                   "fewer jobs than --limit", err=True)
    if not page.indexed:  # a scan's page comes in no order: newest first, as the dashboard
        pairs = sorted(zip(page.jobs, page.last_runs, strict=True),
                       key=lambda p: (p[0].created_ms, p[0].id), reverse=True)
        page = replace(page, jobs=[j for j, _ in pairs], last_runs=[lr for _, lr in pairs])
    answer = listing_json(page)
    if as_json:
        print_json(answer)
        return
    items = answer["jobs"]
    click.echo(table(["id", "type", "queue", "status", "last run", "failing", "next run",
                      "schedule"],
                     [[j["id"], j["type"], j["queue"], j["status"],
                       f"{j['lastRun']['status']} {j['lastRun']['at']}" if j["lastRun"]["status"]
                       else None, _streak(j["lastRun"]), j["nextRunAt"],
                       f"{j['cron']} ({j['timeZone']})" if j["cron"] else j["runAt"]]
                      for j in items]))
    if page.indexed:
        click.echo(f"indexed until {answer['indexedUntil']}", err=True)
    flags = [f"--{name} {shlex.quote(v)}" for name, v in (
        ("status", status), ("type", job_type), ("queue", queue), ("last-run", last_run),
        ("search", search), ("sort", sort)) if v is not None]
    more(page.next_cursor, " ".join(["rsched jobs list", *flags]))


def _streak(last: dict[str, Any]) -> str:
    n = last["failureStreak"]
    return f"{n}{'+' if last['streakCapped'] else ''} in a row" if n else ""


@jobs.command("runs")
@click.argument("job_id")
@click.option("--limit", default=20, show_default=True, type=int)
@click.option("--cursor", default=None)
@JSON_FLAG
@click.pass_context
def jobs_runs(ctx: click.Context, job_id: str, limit: int, cursor: str | None,
              as_json: bool) -> None:
    """A job's attempts, newest first (with RSCHED_ARCHIVE_URL: its whole archived history)."""
    c = client_of(ctx)
    with naming_flags(PAGE_FLAGS):
        body = runs_json(c.run(c.runs_source.op_page(job_id, limit, cursor)))
    items = body["runs"]
    if as_json:
        print_json(body)
        return
    if body.get("partial"):
        click.echo("partial: more events wait in Redis than one read scans; older attempts "
                   "may be missing", err=True)
    click.echo(table(["run", "attempt", "status", "worker", "scheduled", "started", "ms",
                      "error"],
                     [[a["runId"], a["attempt"], a["status"], a["worker"], a["scheduledAt"],
                       a["startedAt"], a["durationMs"], summary(a["error"])] for a in items]))
    more(body["nextCursor"], f"rsched jobs runs {job_id}")


def _control(name: str, doc: str, note: bool) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("job_id")
    @click.option("--if-match", "if_match", type=click.IntRange(min=1), default=None,
                  help="Only if the job is at this version (else an error, nothing changes).")
    @click.pass_context
    def command(ctx: click.Context, job_id: str, if_match: int | None,
                note: str | None = None) -> None:
        extra: dict[str, Any] = {"note": note, "by": "cli"} if name != "cancel" else {}
        try:
            with naming_flags({"note": "--note"}):
                job = getattr(client_of(ctx), name)(job_id, if_match=if_match, **extra)
        except VersionMismatch as e:
            raise Conflict("--if-match", e.reason) from None
        click.echo(f"{job.id} {job.status.value}")

    if note:  # kept in the job, with 'cli' as who and the time
        command = click.option("--note", default=None,
                               help="Why: kept in the job with who (cli) and when.")(command)
    return command


for _name, _doc, _note in (("pause", "Pause a job; a run in progress finishes.", True),
                           ("resume", "Resume a paused job (a cron job from now).", True),
                           ("cancel", "Cancel a job for good; a run in progress finishes.",
                            False)):
    jobs.add_command(_control(_name, _doc, _note))


@jobs.command("backfill")
@click.argument("job_id")
@click.option("--from", "start", required=True, help="ISO-8601 start (inclusive).")
@click.option("--to", "end", required=True, help="ISO-8601 end (exclusive), not after now.")
@click.option("--dry-run", is_flag=True,
              help="Write nothing: list each occurrence and what a backfill would do with it.")
@click.option("--overlap", default=defaults.BACKFILL_OVERLAP, show_default=True,
              help="The backfill's overlap policy: bufferAll runs the occurrences one after "
                   "another; allow, skip, bufferOne or cancelPrevious decide each against the "
                   "job's active run.")
@JSON_FLAG
@click.pass_context
def jobs_backfill(ctx: click.Context, job_id: str, start: str, end: str, dry_run: bool,
                  overlap: str, as_json: bool) -> None:
    """Run each occurrence of a recurring job's schedule in [--from, --to) once, with its
    nominal time; occurrences that have a run already are not run again."""
    c = client_of(ctx)
    with naming_flags({"from": "--from", "to": "--to", "overlap": "--overlap"}):
        res = backfill_json(c.backfill(job_id, start, end, dry_run=dry_run, overlap=overlap))
    show(res, as_json, _render_backfill)


# What a backfill does with an occurrence, by the answer's list: in the counts, and on a dry
# run's line per time.
_FATE = {"queued": ("queued", "would be queued"), "alreadyRun": ("already ran", "already ran"),
         "skipped": ("skipped by overlap", "would be skipped by overlap"),
         "buffered": ("buffered by overlap", "would be buffered by overlap")}


def _backfill_counts(b: dict[str, Any]) -> str:
    """'N queued, M already ran[, K skipped by overlap][, B buffered by overlap]' (a dry run:
    'N would be queued, ...')."""
    n = b["counts"]
    words = {k: v[0] for k, v in _FATE.items()}
    if b["dryRun"]:
        words["queued"] = _FATE["queued"][1]
    return ", ".join(f"{n[k]} {words[k]}" for k in _FATE if n[k] or k in ("queued", "alreadyRun"))


def _render_backfill(b: dict[str, Any]) -> str:
    head = f"{b['count']} occurrence(s) in [{b['from']}, {b['to']})"
    if not b["dryRun"]:
        return f"{head}: {_backfill_counts(b)}"
    fate = {t: _FATE[k][1] for k in _FATE for t in b[k]}
    return "\n".join([*(f"{t}  {fate[t]}" for t in b["times"]),
                      f"{head}: {_backfill_counts(b)}",
                      "dry run: nothing written; run it without --dry-run to do it"])


@jobs.command("trigger")
@click.argument("job_id")
@click.pass_context
def jobs_trigger(ctx: click.Context, job_id: str) -> None:
    """Run a job once now, outside its schedule; prints the run id."""
    click.echo(client_of(ctx).trigger(job_id))
