"""The Starlette application: route table, API-key guard, lifespan, docs.

`create_app(settings)` builds the app; `rsched api` serves it with uvicorn.  Every endpoint sits
behind `protect(endpoint, scope)`, which checks the Bearer key's scope and turns any error into
problem+json, so no request can produce a bare 500 page or a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from rsched.aclient import AsyncClient
from rsched.api import follow, routes
from rsched.api.background import OperationRunner
from rsched.api.browser import (
    HostPolicy,
    default_hosts,
    is_loopback,
    json_only,
    parse_hosts,
    refusal,
    with_security_headers,
)
from rsched.api.docs import DOCS_HTML
from rsched.api.event_hub import EventHub
from rsched.api.guard import Endpoint, KeyCache, protect
from rsched.api.openapi import document
from rsched.api.problems import JSON, problem
from rsched.api.sampler import Sampler
from rsched.api.server import ServerLimits, serve
from rsched.api.ui import routes as ui_routes
from rsched.core import defaults
from rsched.core.settings import Settings
from rsched.rdb.setup import Outage, acheck_redis, is_unavailable, wait_for_redis

log = logging.getLogger("rsched.api")

NO_AUTH_WARNING = (
    "AUTHENTICATION IS OFF (--no-auth): anyone who can reach this port can schedule, change "
    "and cancel jobs and replay dead letters. Use this for local development only."
)

# The API: (method, path, endpoint, scope needed; None = open to all).  Paths are written as in
# the OpenAPI document, which a test checks against this table.
API_ROUTES: list[tuple[str, str, Endpoint, str | None]] = [
    ("POST", "/jobs/batch", routes.create_batch, "write"),
    ("POST", "/jobs", routes.create_job, "write"),
    ("GET", "/jobs", routes.list_jobs, "read"),
    ("GET", "/jobs/{id}", routes.get_job, "read"),
    ("PATCH", "/jobs/{id}", routes.update_job, "write"),
    ("POST", "/jobs/{id}/pause", routes.pause_job, "write"),
    ("POST", "/jobs/{id}/resume", routes.resume_job, "write"),
    ("POST", "/jobs/{id}/cancel", routes.cancel_job, "write"),
    ("POST", "/jobs/{id}/trigger", routes.trigger_job, "write"),
    ("POST", "/jobs/{id}/backfill", routes.backfill_job, "write"),
    ("GET", "/jobs/{id}/runs", routes.job_runs, "read"),
    ("GET", "/jobs/{id}/events", follow.job_events, "read"),
    ("GET", "/events", follow.events, "read"),
    ("GET", "/runs/{runId}", follow.get_run, "read"),
    ("GET", "/dead-letters", routes.dead_letters, "read"),
    ("POST", "/dead-letters/purge", routes.purge_dead_letters, "admin"),
    ("POST", "/dead-letters/{runId}/replay", routes.replay_dead_letter, "admin"),
    ("DELETE", "/dead-letters/{runId}", routes.delete_dead_letter, "admin"),
    ("GET", "/operations", routes.list_operations, "read"),
    ("GET", "/operations/{operationId}", routes.get_operation, "read"),
    ("POST", "/operations/{operationId}/cancel", routes.cancel_operation, "admin"),
    ("GET", "/schedules/preview", routes.preview, "read"),
    ("GET", "/status", routes.status, "read"),
    ("GET", "/memory", routes.memory, "read"),
    ("GET", "/stats/failures", routes.stats_failures, "read"),
    ("GET", "/stats/durations", routes.stats_durations, "read"),
    ("GET", "/stats/overview", routes.stats_overview, "read"),
    ("GET", "/limits", routes.list_limits, "read"),
    ("GET", "/limits/{name}", routes.get_limit, "read"),
    ("PUT", "/limits/{name}", routes.put_limit, "write"),
    ("DELETE", "/limits/{name}", routes.delete_limit, "write"),
    ("GET", "/queues/{queue}/limits", routes.get_queue_limit, "read"),
    ("PUT", "/queues/{queue}/limits", routes.put_queue_limit, "write"),
    ("DELETE", "/queues/{queue}/limits", routes.delete_queue_limit, "write"),
    ("GET", "/api-keys", routes.list_keys, "admin"),
    ("POST", "/api-keys", routes.create_key, "admin"),
    ("DELETE", "/api-keys/{keyId}", routes.revoke_key, "admin"),
    ("GET", "/healthz", routes.healthz, None),
    ("HEAD", "/healthz", routes.healthz_head, None),
    ("GET", "/readyz", routes.readyz, None),
]


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int  # any single-object request body
    max_batch_bytes: int  # POST /jobs/batch


class _ByMethod:
    """One route per path (an ASGI app, so Starlette passes every method through): a wrong
    method is a 405 whose Allow lists exactly the documented methods, after the key check, as
    clients expect a missing key to be a 401 whatever the method."""

    def __init__(self, endpoints: dict[str, Endpoint], scopes: dict[str, str | None]) -> None:
        self.endpoints = endpoints
        self.allow = ", ".join(sorted(endpoints))
        self.open = any(s is None for s in scopes.values())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        endpoint = self.endpoints.get(request.method)
        if endpoint is not None:
            response = await endpoint(request)
        else:
            response = await protect(self._not_allowed, None if self.open else "read")(request)
        await response(scope, receive, send)

    async def _not_allowed(self, request: Request) -> Response:
        return problem(405, f"{request.method} is not allowed here; use {self.allow}",
                       headers={"Allow": self.allow})


class _Api(Starlette):
    """Starlette with a shortcut: a request for one of the API's fixed paths (no path
    parameters) goes straight to its route, past the two exception middlewares and the router,
    a fifth of the app's CPU for a POST /jobs (loadtest/bench_api.py).  Nothing is lost: `protect`
    turns every error of an endpoint into problem+json, and the route is the one the router
    would pick (API routes come first).  Other paths, a root_path, or an app given middleware
    take the usual way."""

    fixed: dict[str, Route] = {}
    hosts = HostPolicy(None)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            # Every answer, a refusal and the dashboard's files too, carries the headers.
            send = with_security_headers(send, scope["path"])
            refused = refusal(scope, self.hosts)
            if refused is not None:
                await refused(scope, receive, send)
                return
            if not self.user_middleware and not scope.get("root_path"):
                route = self.fixed.get(scope["path"])
                if route is not None:
                    scope["app"] = self
                    await route.handle(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Router-level errors (no such path, wrong method) as problem+json too."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    headers = getattr(exc, "headers", None)
    detail = f"no route {request.method} {request.url.path}" if status in (404, 405) else str(exc)
    return problem(status, detail, headers=headers)


async def _check_redis_when_up(client: AsyncClient, settings: Settings,
                               stopping: asyncio.Event) -> None:
    """The start-up checks, once Redis answers (retried as the daemons do)."""
    try:
        await wait_for_redis(lambda: acheck_redis(client.r, settings.allow_unsafe_redis),
                             settings.redis_url, stopping)
    except Exception as e:  # noqa: BLE001 - an unsafe Redis: /readyz says so too
        log.error("Redis start-up check failed: %s", e)


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _api_routes() -> dict[str, Route]:
    """API_ROUTES as one route per path, each method's endpoint behind `protect`."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    scopes: dict[str, dict[str, str | None]] = {}
    for method, path, endpoint, scope in API_ROUTES:
        if method in _BODY_METHODS:
            endpoint = json_only(endpoint)
        by_path.setdefault(path, {})[method] = protect(endpoint, scope)
        scopes.setdefault(path, {})[method] = scope
    return {path: Route(path, _ByMethod(eps, scopes[path])) for path, eps in by_path.items()}


def _doc_routes(spec: dict[str, Any]) -> list[BaseRoute]:
    """/openapi.json (the given document) and /docs, open to all."""

    async def openapi_json(request: Request) -> Response:
        return JSON(spec)

    async def docs(request: Request) -> Response:
        return HTMLResponse(DOCS_HTML)

    return [Route("/openapi.json", openapi_json, methods=["GET"]),
            Route("/docs", docs, methods=["GET"])]


def create_app(
    settings: Settings | None = None,
    *,
    auth: bool = True,
    extra_routes: Sequence[BaseRoute] = (),
    max_body_bytes: int = defaults.MAX_BODY_BYTES,
    max_batch_bytes: int = defaults.MAX_BATCH_BYTES,
    key_cache_s: float = 5.0,
    redis: Redis | None = None,
    archive_url: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
    metrics_auth: bool = False,
) -> Starlette:
    """The HTTP API over the service layer.  ``extra_routes`` (the dashboard's /ui mount,
    /metrics, ...) are added as given: wrap an endpoint in `protect` to require a scope.
    ``archive_url`` (default RSCHED_ARCHIVE_URL): run history for /jobs/{id}/runs and /stats.
    ``allowed_hosts``: the Host names answered (``*.example.com`` for subdomains; None: any);
    ``metrics_auth``: /metrics needs a read key."""
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = AsyncClient(settings=settings, redis=redis, archive_url=archive_url)
        app.state.client = client
        app.state.keys = KeyCache(client, key_cache_s)
        app.state.outage = Outage(log)  # the requests' view of Redis (guard.protect)
        if not auth:
            log.warning(NO_AUTH_WARNING)
        stopping = asyncio.Event()
        checker = None
        try:
            await acheck_redis(client.r, settings.allow_unsafe_redis)
        except Exception as e:
            if not is_unavailable(e):
                raise
            # Serve anyway: /readyz answers 503 until Redis is up (and safe).
            checker = asyncio.create_task(_check_redis_when_up(client, settings, stopping))
        sampler = asyncio.create_task(Sampler(client).run(stopping))
        app.state.events = EventHub(client)
        app.state.operations = OperationRunner(client)
        runner = asyncio.create_task(app.state.operations.run(stopping))
        try:
            yield
        finally:
            stopping.set()
            await asyncio.wait([sampler, runner])
            await app.state.events.close()
            if checker is not None:
                await asyncio.wait([checker])
            await client.close()

    api_routes = _api_routes()
    table: list[BaseRoute] = [*api_routes.values(), *_doc_routes(document(auth=auth))]
    # --- extension point: the dashboard (/ui, /metrics) and later faces add routes here --------

    table += ui_routes(metrics_auth=metrics_auth)
    table += list(extra_routes)

    app = _Api(routes=table, lifespan=lifespan,
               exception_handlers={HTTPException: _http_error, Exception: _http_error})
    app.fixed = {path: route for path, route in api_routes.items() if "{" not in path}
    app.hosts = HostPolicy(allowed_hosts)
    app.state.auth = auth
    app.state.limits = Limits(max_body_bytes, max_batch_bytes)
    app.state.settings = settings
    return app


def openapi_paths() -> set[tuple[str, str]]:
    """(method, path) of every documented operation; a test compares it with the routes."""
    return {(m.upper(), p) for p, ops in document(auth=True)["paths"].items() for m in ops}


__all__ = ["API_ROUTES", "NO_AUTH_WARNING", "ServerLimits", "create_app", "default_hosts",
           "is_loopback", "parse_hosts", "protect", "serve"]
