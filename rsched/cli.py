"""The `rsched` command line: process runners and operator commands over the service layer."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from .app import App
from .errors import RschedError
from .settings import Settings


def _settings(ctx: click.Context) -> Settings:
    obj: dict[str, Any] = ctx.obj or {}
    return Settings.from_env(redis_url=obj.get("redis_url"), partitions=obj.get("partitions"),
                             allow_unsafe_redis=obj.get("allow_unsafe") or None)


def load_app(spec: str) -> App:
    """Import ``module:attr`` and check it is an rsched.App."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise click.BadParameter("expected module:attribute, e.g. myproject.jobs:app", param_hint="--app")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise click.BadParameter(f"cannot import {mod_name!r}: {e}", param_hint="--app") from None
    app = getattr(mod, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec} is not an rsched.App", param_hint="--app")
    return app


@click.group()
@click.option("--redis-url", envvar="RSCHED_REDIS_URL", default=None, help="Redis URL.")
@click.option("--partitions", envvar="RSCHED_PARTITIONS", type=int, default=None,
              help="Partition count (fixed at first start).")
@click.option("--allow-unsafe-redis", "allow_unsafe", is_flag=True,
              help="Run against a Redis that may evict keys (tests only).")
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, partitions: int | None, allow_unsafe: bool,
        log_level: str) -> None:
    """rsched: durable cron and one-off jobs on Redis."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ctx.obj = {"redis_url": redis_url, "partitions": partitions, "allow_unsafe": allow_unsafe}


@cli.command()
@click.option("--lease-ms", default=10_000, show_default=True, help="Partition lease length.")
@click.option("--batch", default=1000, show_default=True, help="Jobs per claim script call.")
@click.option("--max-sleep-ms", default=1000, show_default=True)
@click.option("--misfire-grace-ms", default=60_000, show_default=True,
              help="Lateness after which misfire=skip jobs skip an occurrence.")
@click.option("--id", "dispatcher_id", default=None, help="Dispatcher id (default host-pid).")
@click.pass_context
def dispatcher(ctx: click.Context, lease_ms: int, batch: int, max_sleep_ms: int,
               misfire_grace_ms: int, dispatcher_id: str | None) -> None:
    """Run a dispatcher: lease partitions and move due jobs onto the queues."""
    from .dispatcher.dispatcher import serve

    serve(_settings(ctx), dispatcher_id=dispatcher_id, lease_ms=lease_ms, batch=batch,
          max_sleep_ms=max_sleep_ms, misfire_grace_ms=misfire_grace_ms)


@cli.command()
@click.option("--app", "app_spec", required=True, help="module:attr of an rsched.App.")
@click.option("--queues", default="default", show_default=True, help="Comma-separated queues.")
@click.option("--concurrency", default=16, show_default=True)
@click.option("--visibility-ms", default=30_000, show_default=True,
              help="Idle time after which another worker reclaims a run.")
@click.option("--heartbeat-ms", default=5_000, show_default=True)
@click.option("--grace", default=30.0, show_default=True, help="Seconds to finish runs on SIGTERM.")
@click.option("--id", "worker_id", default=None, help="Worker id (default host-pid).")
@click.pass_context
def worker(ctx: click.Context, app_spec: str, queues: str, concurrency: int, visibility_ms: int,
           heartbeat_ms: int, grace: float, worker_id: str | None) -> None:
    """Run a worker for the handlers of APP."""
    from .worker.worker import serve

    sys.path.insert(0, ".")
    app = load_app(app_spec)
    serve(app, _settings(ctx), queues=[q.strip() for q in queues.split(",") if q.strip()],
          concurrency=concurrency, worker_id=worker_id, visibility_ms=visibility_ms,
          heartbeat_ms=heartbeat_ms, grace_s=grace)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except RschedError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
