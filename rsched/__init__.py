"""rsched: durable one-off and cron jobs on Redis, with fenced claims and at-least-once runs."""

from rsched.client import Client
from rsched.core.errors import Conflict, NotFound, RschedError, ScheduleError, ValidationError
from rsched.core.handlers import App, JobContext
from rsched.core.models import Attempt, Job, JobStatus, Run, RunState
from rsched.core.spec import JobSpec

__version__ = "0.1.0"

__all__ = [
    "App", "Attempt", "Client", "Conflict", "Job", "JobContext", "JobSpec", "JobStatus",
    "NotFound", "Run", "RunState", "RschedError", "ScheduleError", "ValidationError",
    "__version__",
]
