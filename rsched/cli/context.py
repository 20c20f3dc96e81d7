"""What every `rsched` command reads off the root click context: the settings from the global
options, and one shared client.  Its own module so main.py (the group) and commands.py (the
operator commands) both import it and not each other."""

from __future__ import annotations

from typing import Any

import click

from rsched.client import Client
from rsched.core.settings import Settings


def settings_of(ctx: click.Context) -> Settings:
    """Settings from the root group's options (--redis-url, --partitions...), then the env."""
    obj: dict[str, Any] = ctx.find_root().obj or {}
    return Settings.from_env(redis_url=obj.get("redis_url"), partitions=obj.get("partitions"),
                             allow_unsafe_redis=obj.get("allow_unsafe") or None)


def client_of(ctx: click.Context) -> Client:
    """The command's client, created on first use and closed when the command ends."""
    obj = ctx.find_root().obj
    if "client" not in obj:
        obj["client"] = Client(settings=settings_of(ctx))
        ctx.call_on_close(obj["client"].close)
    return obj["client"]  # type: ignore[no-any-return]
