"""rsched: durable one-off and cron jobs on Redis, with fenced claims and at-least-once runs."""

from .app import App, JobContext
from .client import Client
from .errors import Conflict, NotFound, RschedError, ScheduleError, ValidationError
from .models import Attempt, Job, JobStatus, Run, RunState
from .spec import JobSpec

__version__ = "0.1.0"

__all__ = [
    "App", "Attempt", "Client", "Conflict", "Job", "JobContext", "JobSpec", "JobStatus",
    "NotFound", "Run", "RunState", "RschedError", "ScheduleError", "ValidationError",
    "__version__",
]
