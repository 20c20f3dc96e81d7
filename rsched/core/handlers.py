"""The application object a worker loads: a registry of handlers by job type."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Handler = Callable[["JobContext"], Any]


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
