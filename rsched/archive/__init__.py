"""Run history in SQL: the archiver moves the events streams into Postgres or SQLite, exactly once.

``RSCHED_ARCHIVE_URL`` picks the store (``postgresql://...``, or ``sqlite:///path`` as the embedded
default).  ``history`` reads it back, merged with the events Redis still holds.

The names below load on first use (PEP 562): a worker or dispatcher imports the client, which
reaches this package, and must not pay for the SQL drivers (psycopg alone took 145 ms of a
worker's start-up) it never uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rsched.archive.archiver import Archiver, BatchResult, serve
    from rsched.archive.config import ArchiverConfig
    from rsched.archive.events import EventRow, decode
    from rsched.archive.history import (
        RunAttempt,
        RunsPage,
        arecent_events,
        fold,
        job_runs,
        recent_events,
        runs_page,
    )
    from rsched.archive.lag import Lag, archive_lag
    from rsched.archive.stats import DurationStats, Failure, FailuresPage, duration_stats, failures
    from rsched.archive.store import DEFAULT_URL, ENV_URL, Store, StoreUnavailable
    from rsched.archive.stores import open_store

__all__ = [
    "Archiver", "ArchiverConfig", "BatchResult", "DEFAULT_URL", "DurationStats", "ENV_URL",
    "EventRow", "Failure", "FailuresPage", "Lag", "RunAttempt", "RunsPage", "Store",
    "StoreUnavailable", "archive_lag", "arecent_events", "decode", "duration_stats", "failures",
    "fold", "job_runs", "open_store", "recent_events", "runs_page", "serve",
]


_HOME = {
    "Archiver": "archiver", "BatchResult": "archiver", "serve": "archiver",
    "ArchiverConfig": "config", "EventRow": "events", "decode": "events",
    "RunAttempt": "history", "RunsPage": "history", "arecent_events": "history",
    "fold": "history", "job_runs": "history", "recent_events": "history",
    "runs_page": "history", "Lag": "lag", "archive_lag": "lag",
    "DurationStats": "stats", "Failure": "stats", "FailuresPage": "stats",
    "duration_stats": "stats", "failures": "stats", "DEFAULT_URL": "store",
    "ENV_URL": "store", "Store": "store", "StoreUnavailable": "store", "open_store": "stores",
}


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
