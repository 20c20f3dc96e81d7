"""Run history in SQL: the archiver moves the events streams into Postgres or SQLite, exactly once.

``RSCHED_ARCHIVE_URL`` picks the store (``postgresql://...``, or ``sqlite:///path`` as the embedded
default).  ``history`` reads it back, merged with the events Redis still holds.
"""

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
