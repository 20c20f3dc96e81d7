"""Opening an archive store by URL: the one place that knows every dialect.

A dialect's module (and its driver: psycopg took 145 ms to import) loads when a store of it is
opened, not when a process that may never archive imports the client."""

from __future__ import annotations

from rsched.archive.store import ENV_URL, Store, archive_url, redact, sqlite_path
from rsched.core.errors import ValidationError


def open_store(url: str | None = None) -> Store:
    """A store for ``postgresql://...`` or ``sqlite:///path``; connects lazily (see connect())."""
    url = archive_url(url)
    scheme = url.partition(":")[0].lower()
    if scheme in ("postgresql", "postgres"):
        try:
            from rsched.archive.postgres import PostgresStore
        except ImportError as e:
            if e.name is None or not e.name.startswith("psycopg"):
                raise
            raise ValidationError(ENV_URL, "a PostgreSQL archive needs psycopg: pip install "
                                  "'rsched[postgres]'") from None
        return PostgresStore(url)
    if scheme == "sqlite":
        from rsched.archive.sqlite import SqliteStore
        return SqliteStore(sqlite_path(url))
    raise ValidationError(
        ENV_URL, f"expected postgresql://... or sqlite:///path, got {redact(url)!r}"
    )
