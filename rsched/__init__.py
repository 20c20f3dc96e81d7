"""rsched: durable one-off and cron jobs on Redis, with fenced claims and at-least-once runs."""

from typing import TYPE_CHECKING, Any

from rsched.client import Client
from rsched.core.errors import (
    Conflict,
    NotFound,
    RschedError,
    RunFailed,
    ScheduleError,
    ValidationError,
)
from rsched.core.handlers import App, AttemptFailed, JobContext, RateLimited
from rsched.core.models import Attempt, Job, JobStatus, Run, RunState
from rsched.core.spec import Dedup, JobSpec

if TYPE_CHECKING:
    from rsched.aclient import AsyncClient

__version__ = "0.1.0"

__all__ = [
    "App", "AsyncClient", "Attempt", "AttemptFailed", "Client", "Conflict", "Dedup", "Job",
    "JobContext", "JobSpec", "JobStatus", "NotFound", "RateLimited", "Run", "RunFailed", "RunState",
    "RschedError", "ScheduleError", "ValidationError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """AsyncClient on first use: importing rsched for the sync Client skips redis.asyncio."""
    if name == "AsyncClient":
        from rsched.aclient import AsyncClient
        return AsyncClient
    raise AttributeError(f"module 'rsched' has no attribute {name!r}")
