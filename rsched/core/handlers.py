"""The application object a worker loads: a registry of handlers by job type."""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rsched.core import defaults

Handler = Callable[["JobContext"], Any]
MAX_PROGRESS_MESSAGE = 500  # characters of a progress message
MAX_PROGRESS_BYTES = 4096  # JSON of one progress report (value, message, time)


@dataclass(slots=True)
class JobContext:
    """What a handler gets. ``run_id`` is stable across retries: use it as an idempotency key."""

    job_id: str
    run_id: str
    type: str
    attempt: int
    scheduled_ms: int
    payload: Any
    worker_id: str
    cancelled: bool = False
    """True once the run was asked to stop (overlap cancelPrevious: a later occurrence replaces
    it).  A sync handler should check it and return; an async one is cancelled instead."""
    reporter: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    """Where progress goes (the worker sets it; None: progress is dropped)."""
    queue: str = defaults.QUEUE
    """The queue the run came from."""

    def progress(self, value: Any, message: str | None = None) -> None:
        """Report how far the run is: a number from 0 to 100, or any small JSON object, and an
        optional message of up to 500 characters.  The latest one is kept with the run (GET
        /runs/{id}) and sent as a 'progress' event; the worker sends it with the run's next
        heartbeat or within 250 ms, whichever comes first, so calling it in a tight loop adds
        no Redis call per call.  Raises ValueError for anything else."""
        if isinstance(value, bool) or not (
                isinstance(value, (int, float)) and 0 <= value <= 100
                or isinstance(value, (dict, list))):
            raise ValueError("progress takes a number from 0 to 100 or a JSON object or list")
        if message is not None and (not isinstance(message, str)
                                    or len(message) > MAX_PROGRESS_MESSAGE):
            raise ValueError(f"a progress message is a string of at most "
                             f"{MAX_PROGRESS_MESSAGE} characters")
        try:
            text = json.dumps({"value": value, "message": message,
                               "at": int(time.time() * 1000)},
                              separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"progress is no JSON: {e}") from None
        if len(text) > MAX_PROGRESS_BYTES:
            raise ValueError(f"progress is {len(text):,} bytes of JSON, over the limit of "
                             f"{MAX_PROGRESS_BYTES:,}")
        if self.reporter is not None:
            self.reporter(text)

    @property
    def scheduled_at(self) -> datetime:
        """The occurrence's nominal time (its run id's ms), as an aware UTC datetime."""
        return datetime.fromtimestamp(self.scheduled_ms / 1000, tz=UTC)


class RateLimited(Exception):  # noqa: N818 - the name users raise, as a 429 reads
    """Raised by a handler (sync or async) when a downstream says "too many requests": the run
    waits ``retry_after`` seconds and runs again without spending an attempt (docs/limits.md:
    at most defaults.MAX_DEFERRALS times a run, after which it counts as a failed attempt)."""

    def __init__(self, retry_after: float = 1.0) -> None:
        if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or not (
                0 <= retry_after <= 86_400):
            raise ValueError("RateLimited(retry_after=...) takes 0 to 86400 seconds")
        super().__init__(f"rate limited: retry after {retry_after:g} s")
        self.retry_after = retry_after


class AttemptFailed(Exception):  # noqa: N818 - the name users raise, as RateLimited
    """Raised by a handler: the attempt failed for the reason given (recorded as the error,
    without a traceback).  ``retry_after``: the next attempt waits at least these seconds
    (capped by the job's backoff cap); ``final``: the run is dead-lettered at once, whatever
    attempts remain (an HTTP target's 404, say)."""

    def __init__(self, reason: str, *, retry_after: float | None = None,
                 final: bool = False) -> None:
        if retry_after is not None and (isinstance(retry_after, bool) or not isinstance(
                retry_after, (int, float)) or not retry_after >= 0):
            raise ValueError("AttemptFailed(retry_after=...) takes seconds >= 0")
        super().__init__(reason)
        self.retry_after = retry_after
        self.final = final


@dataclass(frozen=True, slots=True)
class Registered:
    fn: Handler
    is_async: bool


class App:
    """Register handlers with ``@app.job("type")``; run them with ``rsched worker --app mod:app``.

    Only registered names can run: a request names a job type, never code, so nothing in a
    payload can make a worker import or execute anything else.
    """

    def __init__(self, name: str = "rsched") -> None:
        self.name = name
        self.handlers: dict[str, Registered] = {}

    def job(self, type: str) -> Callable[[Handler], Handler]:
        """Decorator: register the function as the handler of job ``type`` (sync or async;
        it gets a JobContext and may return a small JSON-serializable result)."""
        def register(fn: Handler) -> Handler:
            if type in self.handlers:
                raise ValueError(f"a handler for job type {type!r} is already registered")
            self.handlers[type] = Registered(fn, inspect.iscoroutinefunction(fn))
            return fn

        return register
