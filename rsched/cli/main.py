"""The `rsched` command line: process runners and operator commands over the service layer.

This module is the composition root of every rsched process, `rsched api` among them (the one
import of the API face; commands.py, the CLI face, never imports rsched.api).  Each process
command imports its own part when it runs: a worker's start-up then skips the HTTP stack, the
archiver and the SQL drivers it never uses (`python -X importtime` shows what each imports).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path

import click
from redis.exceptions import RedisError

from rsched.archive.config import ArchiverConfig
from rsched.cli._apps import load_apps
from rsched.cli._group import GlobalOptionsGroup
from rsched.cli.commands import COMMANDS
from rsched.cli.context import settings_of
from rsched.core import defaults
from rsched.core.errors import RschedError
from rsched.core.handlers import App
from rsched.core.settings import Settings
from rsched.core.spec import QUEUE_PATTERN
from rsched.engine import aio
from rsched.obs import logs, metrics
from rsched.rdb.connect import connect
from rsched.rdb.setup import check_redis, is_unavailable
from rsched.service.workers import release_worker


def refuse_unsafe_redis(settings: Settings) -> None:
    """The start-up check (rdb.setup.check_redis) once, in this process, before it starts
    others (uvicorn, worker processes): an unsafe Redis is refused in one line, not by each
    child again and again.  An unreachable Redis is left to the children's own waiting."""
    try:
        with connect(settings.redis_url, wait=settings.wait_replicas,
                     wait_timeout_ms=settings.wait_timeout_ms, socket_connect_timeout=2) as r:
            check_redis(r, settings.allow_unsafe_redis)
    except Exception as e:
        if not is_unavailable(e):
            raise


@click.group(cls=GlobalOptionsGroup)
@click.version_option(package_name="rsched", prog_name="rsched", message="%(prog)s %(version)s")
@click.option("--redis-url", envvar="RSCHED_REDIS_URL", default=None, help="Redis URL.")
@click.option("--partitions", envvar="RSCHED_PARTITIONS", type=int, default=None,
              help="Partition count (fixed at first start).")
@click.option("--allow-unsafe-redis", "allow_unsafe", is_flag=True,
              help="Run against a Redis that may evict keys (tests only).")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--log-format", envvar="RSCHED_LOG_FORMAT", default="text", show_default=True,
              type=click.Choice(["text", "json"], case_sensitive=False),
              help="json: one JSON object per line [env RSCHED_LOG_FORMAT].")
@click.option("--metrics-port", envvar="RSCHED_METRICS_PORT", default=None,
              help="Serve a dispatcher's, worker's or archiver's Prometheus metrics on PORT or "
                   "HOST:PORT [env RSCHED_METRICS_PORT]; the API serves /metrics itself.")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, partitions: int | None, allow_unsafe: bool,
        log_level: str, log_format: str = "text", metrics_port: str | None = None) -> None:
    """rsched: durable cron and one-off jobs on Redis."""
    logs.setup(log_level, log_format)
    ctx.obj = {"redis_url": redis_url, "partitions": partitions, "allow_unsafe": allow_unsafe}
    # `rsched worker` serves its own: with --processes each child has a port of its own.
    if metrics_port and ctx.invoked_subcommand in ("dispatcher", "archiver"):
        collectors = []
        if ctx.invoked_subcommand == "archiver":
            from rsched.service.status import archive_lag_reader
            read = archive_lag_reader(settings_of(ctx).redis_url)
            collectors.append(metrics.ArchiveLagCollector(read))
        metrics.serve(metrics_port, collectors)


@cli.command()
@click.option("--lease-ms", default=defaults.LEASE_MS, show_default=True,
              help="Partition lease length.")
@click.option("--batch", default=defaults.CLAIM_BATCH, show_default=True,
              help="Jobs per claim script call (per partition); smaller calls let workers' "
                   "reads and reports interleave.")
@click.option("--max-sleep-ms", default=defaults.MAX_SLEEP_MS, show_default=True)
@click.option("--id", "dispatcher_id", default=None, help="Dispatcher id (default host-pid).")
@click.pass_context
def dispatcher(ctx: click.Context, lease_ms: int, batch: int, max_sleep_ms: int,
               dispatcher_id: str | None) -> None:
    """Run a dispatcher: lease partitions and move due jobs onto the queues."""
    from rsched.engine.dispatcher.dispatcher import serve as serve_dispatcher

    serve_dispatcher(settings_of(ctx), dispatcher_id=dispatcher_id, lease_ms=lease_ms, batch=batch,
          max_sleep_ms=max_sleep_ms)


def queue_list(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    """--queues as a list, refused at start (exit 2) when it names no queue or a bad one: an
    empty list used to start a worker that died seconds later."""
    queues = [q.strip() for q in value.split(",") if q.strip()]
    if not queues:
        raise click.BadParameter(f"names no queue ({value!r}); give one or more, comma-separated,"
                                 f" e.g. {defaults.QUEUE}")
    bad = [q for q in queues if not re.fullmatch(QUEUE_PATTERN, q)]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is no queue name: 1-64 characters of letters, "
                                 "digits, _ . -")
    return queues


@cli.command()
@click.option("--app", "app_specs", multiple=True,
              help="module:attr of an rsched.App; repeat it to serve the handlers of several "
                   "(none with --http: HTTP target jobs only).")
@click.option("--queues", default=defaults.QUEUE, show_default=True, callback=queue_list,
              help="Comma-separated queues.")
@click.option("--concurrency", default=defaults.CONCURRENCY, show_default=True)
@click.option("--visibility-ms", default=defaults.VISIBILITY_MS, show_default=True,
              help="Idle time after which another worker reclaims a run.")
@click.option("--heartbeat-ms", default=defaults.HEARTBEAT_MS, show_default=True)
@click.option("--dead-after", "dead_after", default=defaults.DEAD_AFTER_MS / 1000,
              show_default=True, type=click.FloatRange(min=defaults.MIN_DEAD_AFTER_MS / 1000),
              metavar="SECONDS",
              help="A worker whose process heartbeat (every third of this) is this old is "
                   "dead: live workers take over all its runs at once.")
@click.option("--grace", default=defaults.GRACE_S, show_default=True,
              help="Seconds to finish runs on SIGTERM.")
@click.option("--start-after-ms", default=defaults.START_AFTER_MS, show_default=True,
              help="A run still going after this long gets its start recorded on its own; "
                   "quicker runs have it recorded with their outcome.")
@click.option("--handler-wait", "handler_wait", default=defaults.HANDLER_WAIT_S,
              show_default=True, envvar="RSCHED_HANDLER_WAIT_S",
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a run waits for a live worker with its job type's handler on its "
                   "queue (this one sets such runs aside) before it is dead-lettered "
                   "(docs/workers.md).")
@click.option("--id", "worker_id", default=None,
              help="Worker id (default host-pid); with --processes, ID-0, ID-1, ...")
@click.option("--processes", default=defaults.PROCESSES, show_default=True,
              type=click.IntRange(min=1),
              help="Worker processes under one supervisor, each restarted when it dies; with "
                   "--metrics-port PORT, process i serves PORT+i.")
@click.option("--hung-after", default=defaults.HUNG_AFTER_S, show_default=True,
              type=click.FloatRange(min=1), metavar="SECONDS",
              help="With --processes: a worker process silent this long (frozen, or its event "
                   "loop blocked) is killed and restarted.")
@click.option("--http/--no-http", "http", default=False, show_default=True,
              envvar="RSCHED_HTTP",
              help="Run HTTP target jobs (type http) with the built-in handler "
                   "(docs/http-targets.md); RSCHED_HTTP_SIGNING_SECRETS, RSCHED_HTTP_ALLOW and "
                   "RSCHED_HTTP_DENY configure it.")
@click.pass_context
def worker(ctx: click.Context, app_specs: tuple[str, ...], queues: list[str], concurrency: int,
           visibility_ms: int, heartbeat_ms: int, grace: float, start_after_ms: int,
           handler_wait: float, worker_id: str | None, dead_after: float,
           processes: int = defaults.PROCESSES,
           hung_after: float = defaults.HUNG_AFTER_S, http: bool = False) -> None:
    """Run a worker for the handlers of APP (and HTTP target jobs with --http)."""
    sys.path.insert(0, ".")
    if not app_specs and not http:
        raise click.UsageError("give --app module:attr, or --http for HTTP target jobs")
    # in the supervisor too: a bad --app fails once, at once
    app = load_apps(app_specs) if app_specs else App("http")
    metrics_port = ctx.find_root().params.get("metrics_port")
    from rsched.cli._supervisor import ENV_ALIVE, Supervisor, watch_parent
    if processes > 1:
        refuse_unsafe_redis(settings_of(ctx))  # else each child, restarted forever
        sys.exit(Supervisor(worker_argvs(ctx, processes, metrics_port), grace,
                            hung_after_s=hung_after,
                            release=functools.partial(release_worker, settings_of(ctx))).run())
    watch_parent()
    metrics.serve(metrics_port)
    from rsched.engine.worker.worker import serve as serve_worker
    serve_worker(app, settings_of(ctx), alive_file=os.environ.get(ENV_ALIVE), queues=queues,
          concurrency=concurrency, worker_id=worker_id, visibility_ms=visibility_ms,
          heartbeat_ms=heartbeat_ms, grace_s=grace, start_after_ms=start_after_ms,
          handler_wait_s=handler_wait, dead_after_ms=round(dead_after * 1000), http=http)


def worker_argvs(ctx: click.Context, processes: int, metrics_port: str | None) -> list[list[str]]:
    """The command line of each child of `rsched worker --processes`: this one with
    --processes 1, its own --id and --metrics-port; the Redis URL goes by environment (not
    shown by ps)."""
    root = ctx.find_root().params
    if root["redis_url"]:
        os.environ["RSCHED_REDIS_URL"] = root["redis_url"]
    if root["partitions"] is not None:
        os.environ["RSCHED_PARTITIONS"] = str(root["partitions"])
    common = [sys.executable, "-m", "rsched.cli", "--log-level", root["log_level"],
              "--log-format", root["log_format"]]
    if root["allow_unsafe"]:
        common.append("--allow-unsafe-redis")
    p = ctx.params
    apps = [a for spec in p["app_specs"] for a in ("--app", spec)]
    args = ["worker", *apps, "--queues", ",".join(p["queues"]),
            "--concurrency", str(p["concurrency"]), "--visibility-ms", str(p["visibility_ms"]),
            "--heartbeat-ms", str(p["heartbeat_ms"]), "--grace", str(p["grace"]),
            "--start-after-ms", str(p["start_after_ms"]),
            "--handler-wait", repr(p["handler_wait"]), "--dead-after", repr(p["dead_after"]),
            "--processes", "1", "--http" if p["http"] else "--no-http"]
    host, _, port = str(metrics_port or "").rpartition(":")
    if metrics_port and not port.isdigit():
        raise click.BadParameter(f"expected PORT or HOST:PORT, got {metrics_port!r}",
                                 param_hint="--metrics-port")
    argvs = []
    for i in range(processes):
        own = ["--id", f"{p['worker_id']}-{i}"] if p["worker_id"] else []
        if metrics_port and int(port):
            common_i = [*common, "--metrics-port", f"{host}:{int(port) + i}" if host
                        else str(int(port) + i)]
        else:
            common_i = common
        argvs.append([*common_i, *args, *own])
    return argvs


_ARCHIVE = ArchiverConfig()  # the archiver's defaults, for its options' help


@cli.command()
@click.option("--archive-url", default=None,
              help="postgresql://... or sqlite:///path [env RSCHED_ARCHIVE_URL; "
                   "default sqlite:rsched-archive.db]")
@click.option("--batch", type=int, default=None,
              help="Events read per partition per round "
                   f"[env RSCHED_ARCHIVE_BATCH; {_ARCHIVE.batch}].")
@click.option("--poll-ms", type=int, default=None,
              help=f"Wait after an empty round [env RSCHED_ARCHIVE_POLL_MS; {_ARCHIVE.poll_ms}].")
@click.option("--claim-idle-ms", type=int, default=None,
              help="Take over a dead archiver's events after this idle time "
                   f"[env RSCHED_ARCHIVE_CLAIM_IDLE_MS; {_ARCHIVE.claim_idle_ms}].")
@click.option("--retention-days", type=int, default=None,
              help="Days of history kept, 0 = all "
                   f"[env RSCHED_ARCHIVE_RETENTION_DAYS; {_ARCHIVE.retention_days}].")
@click.option("--backlog-warn", type=int, default=None,
              help="Warn when this many events wait in Redis "
                   f"[env RSCHED_ARCHIVE_BACKLOG_WARN; {_ARCHIVE.backlog_warn}].")
@click.option("--id", "archiver_id", default=None,
              help="Consumer name; reuse it across restarts to resume its own batch at once.")
@click.pass_context
def archiver(ctx: click.Context, archive_url: str | None, batch: int | None,
             poll_ms: int | None, claim_idle_ms: int | None, retention_days: int | None,
             backlog_warn: int | None, archiver_id: str | None) -> None:
    """Run an archiver: move the events streams into the run-history store, exactly once."""
    from rsched.archive.archiver import serve as serve_archiver

    config = ArchiverConfig.from_env(url=archive_url, batch=batch, poll_ms=poll_ms,
                                     claim_idle_ms=claim_idle_ms, retention_days=retention_days,
                                     backlog_warn=backlog_warn)
    serve_archiver(settings_of(ctx), config, archiver_id=archiver_id)


class _OneLineUsageError(click.ClickException):
    """A refused combination of options: one line, exit 2 like click's usage errors."""

    exit_code = 2


@cli.command()
@click.option("--host", default=defaults.API_HOST, show_default=True, envvar="RSCHED_API_HOST")
@click.option("--port", default=defaults.API_PORT, show_default=True, type=int,
              envvar="RSCHED_API_PORT")
@click.option("--no-auth", is_flag=True,
              help="Serve without API keys: local development only (logs a loud warning).")
@click.option("--no-auth-on-network", is_flag=True,
              help="Allow --no-auth with a --host that is not loopback: anyone on the network "
                   "may then do anything.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, envvar="RSCHED_ALLOWED_HOSTS",
              help="A Host name this server answers (repeat, or comma-separate; *.example.com "
                   "for subdomains; * for any) [env RSCHED_ALLOWED_HOSTS; default: the loopback "
                   "names when --host is loopback, else any].")
@click.option("--metrics-auth", is_flag=True, envvar="RSCHED_METRICS_AUTH",
              help="/metrics needs a read key, like the API [env RSCHED_METRICS_AUTH].")
@click.option("--max-body-bytes", default=defaults.MAX_BODY_BYTES, show_default=True,
              help="Largest request body (POST /jobs/batch has its own limit).")
@click.option("--max-batch-bytes", default=defaults.MAX_BATCH_BYTES, show_default=True)
@click.option("--max-head-bytes", default=defaults.MAX_HEAD_BYTES, show_default=True,
              type=click.IntRange(min=1024), help="Request line and headers; more is a 431.")
@click.option("--max-headers", default=defaults.MAX_HEADERS, show_default=True,
              type=click.IntRange(min=1), help="Header lines in a request; more is a 431.")
@click.option("--head-timeout", default=defaults.HEAD_TIMEOUT_S, show_default=True,
              type=click.FloatRange(min=0.1), help="Seconds to send a request's headers.")
@click.option("--body-timeout", default=defaults.BODY_TIMEOUT_S, show_default=True,
              type=click.FloatRange(min=0.1), help="Seconds to send a request's body.")
@click.option("--keep-alive", default=defaults.KEEP_ALIVE_S, show_default=True,
              type=click.IntRange(min=1), help="Seconds an idle connection stays open.")
@click.option("--max-connections", default=defaults.MAX_CONNECTIONS, show_default=True,
              type=click.IntRange(min=1), help="Open connections; more are answered 503.")
@click.option("--access-log/--no-access-log", default=False, show_default=True)
@click.option("--dev-echo", is_flag=True, hidden=True,
              help="rsched dev: serve /dev/echo, open to all, for the sample HTTP target job.")
@click.pass_context
def api(ctx: click.Context, host: str, port: int, no_auth: bool, no_auth_on_network: bool,
        allowed_hosts: tuple[str, ...], metrics_auth: bool, max_body_bytes: int,
        max_batch_bytes: int, max_head_bytes: int, max_headers: int, head_timeout: float,
        body_timeout: float, keep_alive: int, max_connections: int, access_log: bool,
        dev_echo: bool = False) -> None:
    """Serve the HTTP API (uvicorn)."""
    from rsched.api.app import (
        NO_AUTH_WARNING,
        ServerLimits,
        create_app,
        default_hosts,
        is_loopback,
        parse_hosts,
        serve,
    )
    from rsched.api.echo import echo_routes

    if no_auth and not no_auth_on_network and not is_loopback(host):
        raise _OneLineUsageError(f"--no-auth with --host {host} (not loopback) would let "
                                 "anyone on the network do anything; add --no-auth-on-network "
                                 "to mean it, or serve on 127.0.0.1")
    hosts = parse_hosts(allowed_hosts) or default_hosts(host)
    settings = settings_of(ctx)
    refuse_unsafe_redis(settings)  # with one line, before uvicorn starts
    if no_auth:
        click.secho(f"WARNING: {NO_AUTH_WARNING}", fg="red", bold=True, err=True)
    app = create_app(settings, auth=not no_auth, max_body_bytes=max_body_bytes,
                     max_batch_bytes=max_batch_bytes, allowed_hosts=hosts,
                     metrics_auth=metrics_auth, extra_routes=echo_routes() if dev_echo else ())
    limits = ServerLimits(max_head_bytes=max_head_bytes, max_headers=max_headers,
                          head_timeout_s=head_timeout, body_timeout_s=body_timeout,
                          keep_alive_s=keep_alive, max_connections=max_connections)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    aio.tune_gc()
    # log_config=None: uvicorn's lines go through rsched.logs (text or JSON)
    serve(app, host, port, limits, log_level=level, access_log=access_log, lifespan="on",
          timeout_graceful_shutdown=10, proxy_headers=False, server_header=False,
          log_config=None)


for _command in COMMANDS:
    cli.add_command(_command)


@cli.command()
@click.option("--app", "app_specs", multiple=True,
              help="module:attr of your rsched.App, served by the worker (repeatable); without "
                   "it, the bundled examples (source tree only).")
@click.option("--examples", is_flag=True,
              help="Also run the bundled example handlers and schedule their sample jobs.")
@click.option("--queues", default=defaults.QUEUE, show_default=True, callback=queue_list,
              help="Comma-separated queues the worker serves.")
@click.option("--port", default=defaults.API_PORT, show_default=True,
              help="API and dashboard port.")
@click.option("--host", default=defaults.API_HOST, show_default=True)
@click.option("--data-dir", default=defaults.DEV_DATA_DIR, show_default=True, type=click.Path(),
              help="Redis data (AOF), the SQLite history, the admin key and logs (mode 0700).")
@click.option("--redis-url", "dev_redis_url", default=None,
              help="Use this Redis instead of starting one (RSCHED_REDIS_URL is ignored here).")
@click.option("--fresh", is_flag=True, help="Delete the data directory first: start over.")
@click.option("--verbose", "-v", is_flag=True, help="Show every log line, not only warnings.")
@click.option("--no-metrics-ports", is_flag=True,
              help="Do not serve the dispatcher's, worker's and archiver's metrics on PORT+1..3.")
def dev(app_specs: tuple[str, ...], examples: bool, queues: list[str], port: int, host: str,
        data_dir: str, dev_redis_url: str | None, fresh: bool, verbose: bool,
        no_metrics_ports: bool) -> None:
    """Run everything locally: Redis, API + dashboard, dispatcher, a worker for --app, archiver.

    A private redis-server, with a generated password, keeps its data in --data-dir
    (--redis-url uses an existing Redis instead); Ctrl-C stops everything, and the next start
    finds every job.  Without --app, in the source tree, the worker runs the bundled examples
    and their sample jobs are scheduled.
    """
    from rsched.cli.dev import DevOptions
    from rsched.cli.dev import run as run_dev
    sys.exit(run_dev(DevOptions(apps=app_specs, examples=examples, queues=tuple(queues),
                                host=host, port=port, redis_url=dev_redis_url,
                                data_dir=Path(data_dir), fresh=fresh, verbose=verbose,
                                metrics_ports=not no_metrics_ports)))


def main() -> None:
    """Entry point: errors become one line on stderr and a non-zero exit, never a traceback."""
    try:
        cli(standalone_mode=True)
    except RschedError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except RedisError as e:  # a wrong password too is a ConnectionError for redis-py
        click.echo(f"error: {'cannot reach Redis' if is_unavailable(e) else 'Redis'}: {e}",
                   err=True)
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - one line, no traceback (RSCHED_DEBUG=1 shows it)
        if os.environ.get("RSCHED_DEBUG"):
            raise
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
