"""The CLI made consistent: global options after the subcommand, --version, the dead-letter
filters on `dlq list`, every job option on `jobs add`, errors naming the flag, lists in the
dashboard's order, and no traceback inside a table."""

from __future__ import annotations

import asyncio
import json
import time
from importlib.metadata import version
from typing import Any

import click
import pytest
from click.testing import CliRunner
from support.cli import as_json, ok, rsched, run_main
from support.helpers import Rig

from rsched import App, JobContext
from rsched.cli._group import GlobalOptionsGroup
from rsched.cli._output import table
from rsched.cli.main import cli


def bare(*args: str) -> Any:
    """The CLI with nothing in front of the subcommand."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_global_options_work_after_the_subcommand_too(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "report").strip()
    for args in (["jobs", "list", "--redis-url", redis_url, "--json"],
                 ["jobs", "list", f"--redis-url={redis_url}", "--json", "--log-level", "ERROR"],
                 ["jobs", "show", job_id, "--json", "--redis-url", redis_url]):
        result = bare(*args)
        assert result.exit_code == 0, (args, result.output)
        body = json.loads(result.stdout)
        assert job_id in json.dumps(body), args


def test_an_option_a_subcommand_has_itself_stays_its_own() -> None:
    @click.group(cls=GlobalOptionsGroup)
    @click.option("--redis-url")
    @click.pass_context
    def root(ctx: click.Context, redis_url: str | None) -> None:
        ctx.obj = {"root": redis_url}

    @root.command()
    @click.option("--redis-url", "own")
    @click.option("--payload")
    @click.pass_context
    def dev(ctx: click.Context, own: str | None, payload: str | None) -> None:
        click.echo(f"{ctx.obj['root']} {own} {payload}")

    @root.command()
    @click.option("--payload")
    @click.argument("rest", nargs=-1)
    @click.pass_context
    def add(ctx: click.Context, payload: str | None, rest: tuple[str, ...]) -> None:
        click.echo(f"{ctx.obj['root']} {payload} {list(rest)}")

    def out(*args: str) -> str:
        return CliRunner().invoke(root, list(args), catch_exceptions=False).stdout.strip()

    assert out("dev", "--redis-url", "u") == "None u None"
    assert out("add", "--redis-url", "u", "--payload", "p") == "u p []"
    assert out("add", "--payload", "--redis-url") == "None --redis-url []"  # a value, not a flag
    assert out("add", "--", "--redis-url", "u") == "None None ['--redis-url', 'u']"


def test_version_prints_the_installed_version() -> None:
    result = bare("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"rsched {version('rsched')}"


def test_dlq_list_takes_the_filters_purge_and_the_api_have(redis_url: str) -> None:
    app = App("cli-filters")

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise ValueError("no such customer")

    @app.job("bang")
    def bang(ctx: JobContext) -> None:
        raise KeyError("quota")

    boom_id = ok(redis_url, "jobs", "add", "--type", "boom", "--max-attempts", "1").strip()
    bang_id = ok(redis_url, "jobs", "add", "--type", "bang", "--max-attempts", "1").strip()

    async def run_both() -> None:
        async with Rig(redis_url, app) as rig:
            for _ in range(50):  # until both are dead letters
                await rig.cycle()
                if len(as_json(redis_url, "dlq", "list")["deadLetters"]) == 2:
                    return

    asyncio.run(run_both())

    def listed(*flags: str) -> list[str]:
        return [d["jobId"] for d in as_json(redis_url, "dlq", "list", *flags)["deadLetters"]]

    assert sorted(listed()) == sorted([boom_id, bang_id])
    assert listed("--type", "boom") == [boom_id]
    assert sorted(listed("--queue", "default")) == sorted([boom_id, bang_id])
    assert listed("--queue", "other") == []
    assert listed("--error-contains", "CUSTOMER") == [boom_id]
    assert listed("--older-than", "3600") == []
    bad = rsched(redis_url, "dlq", "list", "--type", "no spaces")
    assert bad.exit_code == 2 and "'--type'" in bad.stderr


def test_jobs_add_has_every_option_the_api_has(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "report", "--timeout", "5.5",
                "--backoff-base", "2", "--backoff-cap", "60", "--jitter", "1.5",
                "--paused").strip()
    shown = as_json(redis_url, "jobs", "show", job_id)
    assert (shown["timeoutSeconds"], shown["jitterSeconds"], shown["status"]) == (
        5.5, 1.5, "paused")
    assert shown["backoff"] == {"baseSeconds": 2, "capSeconds": 60}
    for flag, value in (("--backoff-cap", "-1"), ("--timeout", "0"), ("--jitter", "1e9")):
        done = run_main(redis_url, "jobs", "add", "--type", "report", flag, value)
        assert done.returncode == 1 and done.stderr.startswith(f"error: {flag}:"), (
            flag, done.stderr)
    assert as_json(redis_url, "jobs", "list")["jobs"] == [shown | {
        "lastRun": as_json(redis_url, "jobs", "list")["jobs"][0]["lastRun"]}]


def test_an_idempotency_conflict_names_the_flag(redis_url: str) -> None:
    ok(redis_url, "jobs", "add", "--type", "report", "--idempotency-key", "k1")
    done = run_main(redis_url, "jobs", "add", "--type", "other", "--idempotency-key", "k1")
    assert done.returncode == 1
    assert done.stderr.startswith("error: --idempotency-key:"), done.stderr
    assert "Traceback" not in done.stderr


def test_jobs_list_shows_the_newest_first_like_the_dashboard(redis_url: str) -> None:
    made = []
    for i in range(12):
        made.append(ok(redis_url, "jobs", "add", "--type", f"t{i}").strip())
        # Each command stamps its ids by its own reading of Redis's clock, off by up to half a
        # round trip, which a busy machine makes long: far enough apart to be told apart.
        time.sleep(0.05)
    listed = [j["id"] for j in as_json(redis_url, "jobs", "list")["jobs"]]
    assert listed == made[::-1]
    lines = ok(redis_url, "jobs", "list").splitlines()[1:]
    assert [ln.split()[0] for ln in lines] == made[::-1]


def test_a_table_cell_never_holds_a_traceback() -> None:
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom'
    out = table(["run", "error"], [["r1", trace], ["r2", "one line\n"]]).splitlines()
    assert out == ["RUN  ERROR", "r1   Traceback (most recent call last): ...", "r2   one line"]


@pytest.mark.parametrize("command", [["jobs", "list"], ["jobs", "runs", "3-P84AAAAAAAAAAAAAAAAAA"],
                                     ["dlq", "list"], ["operations", "list"]])
def test_every_paged_command_names_its_limit_and_cursor_flags_in_errors(
        redis_url: str, command: list[str]) -> None:
    for args, flag in ((["--limit", "0"], "--limit"), (["--cursor", "zz"], "--cursor")):
        bad = run_main(redis_url, *command, *args)
        assert bad.returncode == 1 and bad.stderr.startswith(f"error: {flag}:"), (args, bad)
