"""`rsched jobs update`: change a job as PATCH /jobs/{id} does, each flag one field; an error
names the flag."""

from __future__ import annotations

import json
from typing import Any

import click

from rsched.cli._output import JSON_FLAG, naming_flags, show
from rsched.cli.context import client_of
from rsched.core.errors import Conflict, ValidationError, VersionMismatch
from rsched.core.values import TOO_DEEP, VALUE_DEPTH
from rsched.service.inputs import patch_from_json
from rsched.service.shapes import job_json

NONE = "none"  # a lifecycle flag's value that removes the limit (JSON null in the API)
UPDATE_FLAGS = {"runAt": "--run-at", "cron": "--cron", "timeZone": "--tz",
                "payload": "--payload", "maxAttempts": "--max-attempts",
                "priority": "--priority", "misfire": "--misfire",
                "catchUpWindowSeconds": "--catch-up-window", "overlap": "--overlap",
                "startAt": "--start-at", "endAt": "--end-at", "maxRuns": "--max-runs",
                "pauseAfterFailures": "--pause-after-failures",
                "startDeadlineSeconds": "--start-deadline"}
_LIFE = {"start_at": ("startAt", str), "end_at": ("endAt", str), "max_runs": ("maxRuns", int),
         "pause_after_failures": ("pauseAfterFailures", int),
         "start_deadline": ("startDeadlineSeconds", float)}


def _life(raw: str, field: str, conv: type) -> Any:
    """A lifecycle flag's value: ``none`` removes the limit; else the flag's type."""
    if raw == NONE:
        return None
    try:
        return conv(raw)
    except ValueError:
        raise ValidationError(field, f"expected a {conv.__name__} or '{NONE}', got {raw!r}"
                              ) from None


@click.command("update")
@click.argument("job_id")
@click.option("--run-at", default=None, help="ISO-8601: a one-off job's new time.")
@click.option("--cron", default=None, help="A recurring job's new cron expression.")
@click.option("--tz", default=None, help="IANA time zone of the cron expression.")
@click.option("--payload", default=None, help="The new JSON payload (null: none).")
@click.option("--max-attempts", type=int, default=None)
@click.option("--priority", type=int, default=None)
@click.option("--misfire", default=None, help="run_once or skip.")
@click.option("--catch-up-window", "catch_up", type=float, default=None, help="Seconds.")
@click.option("--overlap", default=None, help="allow, skip, bufferOne or cancelPrevious.")
@click.option("--start-at", default=None, help=f"ISO-8601, or '{NONE}' to remove it.")
@click.option("--end-at", default=None, help=f"ISO-8601, or '{NONE}' to remove it.")
@click.option("--max-runs", default=None, help=f"A count, or '{NONE}' to remove it.")
@click.option("--pause-after-failures", default=None, help=f"A count, or '{NONE}'.")
@click.option("--start-deadline", default=None, help=f"Seconds, or '{NONE}'.")
@click.option("--if-match", "--if-version", "if_match", type=click.IntRange(min=1), default=None,
              help="Only if the job is at this version (its 'version'); else nothing changes.")
@JSON_FLAG
@click.pass_context
def jobs_update(ctx: click.Context, /, job_id: str, run_at: str | None, cron: str | None,
                tz: str | None, payload: str | None, max_attempts: int | None,
                priority: int | None, misfire: str | None, catch_up: float | None,
                overlap: str | None, if_match: int | None, as_json: bool,
                **life: str | None) -> None:
    """Reschedule a job or change its payload, retries, priority, policies or lifecycle
    limits; prints the job's new version (the job with --json)."""
    body: dict[str, Any] = {k: v for k, v in (
        ("runAt", run_at), ("cron", cron), ("timeZone", tz), ("maxAttempts", max_attempts),
        ("priority", priority), ("misfire", misfire), ("catchUpWindowSeconds", catch_up),
        ("overlap", overlap)) if v is not None}
    with naming_flags(UPDATE_FLAGS):
        if payload is not None:
            try:
                body["payload"] = json.loads(payload)
            except ValueError as e:
                raise ValidationError("payload", f"not JSON: {e}") from None
            except RecursionError:
                raise ValidationError("payload", f"{TOO_DEEP}; the limit is {VALUE_DEPTH}"
                                      ) from None
        for name, raw in life.items():
            if raw is not None:
                field, conv = _LIFE[name]
                body[field] = _life(raw, field, conv)
        if not body:
            raise click.UsageError("nothing to change: give at least one of "
                                   + ", ".join(UPDATE_FLAGS.values()))
        patch = patch_from_json(body)
        try:
            job = client_of(ctx).update(job_id, patch, if_match=if_match)
        except VersionMismatch as e:
            raise Conflict("--if-match", e.reason + ": read it again (rsched jobs show) and "
                                                    "retry with its version") from None
    show(job_json(job), as_json, lambda j: f"{j['id']} version {j['version']}")
