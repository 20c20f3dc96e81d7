"""What every `rsched` command reads off the root click context: the settings from the global
options, and one shared client.  Its own module so main.py (the group) and commands.py (the
operator commands) both import it and not each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rsched.client import Client, dev_urls
from rsched.core import defaults
from rsched.core.settings import Settings
from rsched.rdb.connect import _safe as masked


def settings_of(ctx: click.Context) -> Settings:
    """Settings from the root group's options (--redis-url, --partitions...), then the env."""
    obj: dict[str, Any] = ctx.find_root().obj or {}
    if obj.get("redis_url") is None:  # neither --redis-url nor RSCHED_REDIS_URL
        obj["redis_url"] = _fallback_url()
    return Settings.from_env(redis_url=obj.get("redis_url"), partitions=obj.get("partitions"),
                             allow_unsafe_redis=obj.get("allow_unsafe") or None)


def _fallback_url() -> str:
    """The Redis of the `rsched dev` running in this directory, else the default; either way
    said on stderr (the password masked), so nobody works on an unintended Redis unknowingly."""
    dev = dev_urls()
    if dev is not None:
        where = Path(defaults.DEV_DATA_DIR) / defaults.DEV_URL_FILE
        click.echo(f"note: using {masked(dev[0])}, the Redis of rsched dev ({where}); set "
                   "RSCHED_REDIS_URL or --redis-url for another", err=True)
        return dev[0]
    url = Settings().redis_url
    click.echo(f"note: RSCHED_REDIS_URL is not set: using the default {url}", err=True)
    return url


def client_of(ctx: click.Context, *, checked: bool = True) -> Client:
    """The command's client, created on first use and closed when the command ends; on the
    Redis of the `rsched dev` running here, it reads that dev's archive too (as Client does).
    ``checked``: before its first use, refuse a URL rsched cannot work with (a plain URL at a
    cluster node, writes waiting for replicas the masters lack: Client.check); a command that
    reads only the archive, or judges those itself (doctor), passes False."""
    obj = ctx.find_root().obj
    if "client" not in obj:
        obj["client"] = Client(settings=settings_of(ctx))
        ctx.call_on_close(obj["client"].close)
    if checked and not obj.get("checked"):
        obj["client"].check()
        obj["checked"] = True
    return obj["client"]  # type: ignore[no-any-return]
