"""Operator commands of the `rsched` CLI: status, preview and doctor here; the groups jobs, dlq,
keys, stats, operations, runs and limits in rsched.cli.jobs (with .job_update and .runs's
watch), .dead_letters, .apikeys, .stats, .operations, .runs and .limits; COMMANDS lists them all.

They talk to Redis through the same service layer as the HTTP API (rsched.service), and print
the same JSON shapes with ``--json`` (rsched.service.shapes), tables otherwise; they never import
rsched.api.  Errors reach `rsched.cli.main`, which prints one line to stderr and exits non-zero.
"""

from __future__ import annotations

import sys
import time

import click

from rsched.cli._output import JSON_FLAG, naming_flags, print_json, show, table
from rsched.cli.apikeys import keys
from rsched.cli.context import client_of
from rsched.cli.dead_letters import dlq
from rsched.cli.job_update import jobs_update
from rsched.cli.jobs import jobs
from rsched.cli.limits import limits
from rsched.cli.operations import operations
from rsched.cli.runs import jobs_watch, runs
from rsched.cli.stats import stats
from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.times import ms_to_iso, to_ms
from rsched.core.views import Status
from rsched.service.doctor import judge, op_redis_facts
from rsched.service.inputs import known_job_id
from rsched.service.memory import findings as memory_findings
from rsched.service.memory import op_projection
from rsched.service.preview import fire_times, job_fire_times
from rsched.service.shapes import finding_json, status_json
from rsched.service.status import op_status


@click.command()
@JSON_FLAG
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Partitions, dispatchers, workers, queue depths and dead letters."""
    c = client_of(ctx)
    s = c.run(op_status(c))
    if as_json:
        print_json(status_json(s))
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
    work = table(["worker", "queues", "inflight", "last heartbeat", "state"],
                 [[w.id, ",".join(w.queues), w.inflight if w.alive else None,
                   ms_to_iso(w.last_heartbeat_ms),
                   "alive" if w.alive else f"DEAD since {ms_to_iso(w.dead_since_ms)}"]
                  for w in s.workers])
    queues = table(["queue", "length", "pending", "live workers"],
                   [[q.queue, q.length, q.pending,
                     "NONE: runs wait" if q.unserved else q.live_workers] for q in s.queues])
    live = sum(w.alive for w in s.workers)
    head = (f"{ms_to_iso(s.now_ms)}  due backlog {s.due_backlog}  dead letters "
            f"{s.dead_letters}  dispatchers {len(s.dispatchers)}  workers {live} live"
            + (f", {len(s.workers) - live} dead" if live < len(s.workers) else ""))
    lacking = [w for w in s.waiting if not w.served]
    if lacking:
        head += "  WAITING FOR A HANDLER: " + ", ".join(
            f"type {w.type} on queue {w.queue} ({w.runs} runs)" for w in lacking)
    out = [head, parts, disp, work, queues]
    if s.waiting:
        out.append(table(["waiting for a handler: queue", "job type", "runs", "live worker"],
                         [[w.queue, w.type, w.runs,
                           "yes" if w.served else "NONE has the handler"] for w in s.waiting]))
    out += [f"warning: queue {q.queue!r} holds {q.length} runs and no live worker reads it "
            f"(rsched worker --app ... --queues {q.queue})" for q in s.queues if q.unserved]
    return "\n\n".join(out)


@click.command()
@click.argument("cron", required=False)
@click.option("--tz", default=None, help="IANA time zone (default UTC).")
@click.option("--job", "job_id", default=None,
              help="A job id instead of CRON: its schedule, each time its startAt, endAt or "
                   "maxRuns would skip marked.")
@click.option("--from", "start", default=None, help="ISO-8601 start (exclusive); default now.")
@click.option("--count", default=5, show_default=True, type=int)
@JSON_FLAG
@click.pass_context
def preview(ctx: click.Context, cron: str | None, tz: str | None, job_id: str | None,
            start: str | None, count: int, as_json: bool) -> None:
    """Print the next fire times of CRON in a zone, with the DST rules applied."""
    from_ms = int(time.time() * 1000) if start is None else to_ms(start, "--from")
    with naming_flags({"cron": "CRON", "timeZone": "--tz", "count": "--count",
                       "jobId": "--job"}):
        if job_id is not None:
            if cron is not None or tz is not None:
                raise ValidationError("--job", "give either --job or CRON (and --tz)")
            job = client_of(ctx).get(known_job_id(job_id))
            times = job_fire_times(job, from_ms, count)
        else:
            times = fire_times(cron, defaults.TZ if tz is None else tz, from_ms, count)
    cols = ["utc", "local"] + (["skipped"] if job_id is not None else [])
    show(times, as_json, lambda ts: table(cols, [[t.get(c, "") for c in cols] for t in ts]))


@click.command()
@JSON_FLAG
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check Redis: version, eviction policy, AOF and fsync, partition count; and project its
    memory: the scheduled backlog, finished jobs kept, the events streams at their bound."""
    c = client_of(ctx, checked=False)  # a replica shortfall is a finding here, not a refusal
    c.check(replicas=False)
    facts = c.run(op_redis_facts())
    findings = judge(facts, c.settings.partitions, c.wait_replicas)
    if facts.get("partitions"):  # what Redis's memory will come to (docs/memory.md)
        findings += memory_findings(c.run(op_projection(c, facts["partitions"])))
    rows = [finding_json(f) for f in findings]
    show(rows, as_json, lambda rs: table(["check", "level", "message"],
                                          [[r["check"], r["level"].upper(), r["message"]]
                                           for r in rs]))
    if any(f.level == "fail" for f in findings):
        sys.exit(1)


jobs.add_command(jobs_update)
jobs.add_command(jobs_watch)
COMMANDS: list[click.Command] = [status, preview, doctor, jobs, dlq, keys, stats, operations, runs,
                                 limits]
