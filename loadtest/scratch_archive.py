"""A scratch archive store for a benchmark: a new Postgres database, dropped afterwards, or a
SQLite file in a temporary directory."""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql


def add_store_args(ap: argparse.ArgumentParser) -> None:
    """--store postgres|sqlite and --pg-admin-dsn (where the scratch database is created)."""
    ap.add_argument("--store", choices=["postgres", "sqlite"], default="postgres")
    ap.add_argument("--pg-admin-dsn", default=os.environ.get(
        "RSCHED_TEST_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))


@contextmanager
def scratch_archive(args: argparse.Namespace, prefix: str) -> Iterator[tuple[str, Path]]:
    """The archive URL of a fresh store of ``args.store``, and a temporary directory (the
    SQLite file is ``archive.db`` in it); both are removed on leaving."""
    db = f"rsched_bench_{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        if args.store == "sqlite":
            yield f"sqlite:///{tmp}/archive.db", Path(tmp)
            return
        with psycopg.connect(args.pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        try:
            yield urlsplit(args.pg_admin_dsn)._replace(path=f"/{db}").geturl(), Path(tmp)
        finally:
            with psycopg.connect(args.pg_admin_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(db)))
