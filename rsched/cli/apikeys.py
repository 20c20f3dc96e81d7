"""`rsched keys`: create, list and revoke the HTTP API's keys."""

from __future__ import annotations

import click

from rsched.cli._output import JSON_FLAG, naming_flags, show, table
from rsched.cli.context import client_of
from rsched.service import apikeys
from rsched.service.shapes import key_json


@click.group()
def keys() -> None:
    """API keys for the HTTP API."""


@keys.command("create")
@click.option("--scope", required=True, type=click.Choice(apikeys.SCOPES))
@click.option("--name", required=True, help="Who or what uses the key.")
@click.pass_context
def keys_create(ctx: click.Context, scope: str, name: str) -> None:
    """Create a key; prints its secret once (only a hash is stored)."""
    with naming_flags({"name": "--name", "scope": "--scope"}):
        key, secret = client_of(ctx).run(apikeys.op_create_key(name, scope))
    click.echo(f"created {key.id} ({key.name}, scope {key.scope}); the secret is shown once:",
               err=True)
    click.echo(secret)


@keys.command("list")
@JSON_FLAG
@click.pass_context
def keys_list(ctx: click.Context, as_json: bool) -> None:
    """List keys (never their secrets)."""
    items = [key_json(k) for k in client_of(ctx).run(apikeys.op_list_keys())]
    show(items, as_json, lambda ks: table(["id", "name", "scope", "created"],
                                           [[k["id"], k["name"], k["scope"], k["createdAt"]]
                                            for k in ks]))


@keys.command("revoke")
@click.argument("key")
@click.pass_context
def keys_revoke(ctx: click.Context, key: str) -> None:
    """Revoke a key by id (or by name, if unique)."""
    k = client_of(ctx).run(apikeys.op_revoke_key(key))
    click.echo(f"revoked {k.id} ({k.name})")
