"""The dashboard at /ui (static HTML, CSS and JavaScript shipped in the package) and /metrics.

The dashboard is a client of the HTTP API like any other: it sends the user's API key as a
Bearer token and shows only the buttons that key's scope allows (``GET /ui/session`` tells it
the scope).  ``/metrics`` is open like ``/healthz``, as Prometheus scrapers expect, unless
``rsched api --metrics-auth`` asks for a read key: this process's counters plus the cluster view
read from Redis at scrape time (rsched.service.status.op_cluster, rendered by rsched.obs.metrics).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from rsched.api.guard import protect
from rsched.api.problems import JSON, problem
from rsched.obs import metrics
from rsched.service.status import op_cluster


async def session(request: Request) -> Response:
    """Who the dashboard is signed in as: the key's name and scope (everything without auth)."""
    if not request.app.state.auth:
        return JSON({"auth": False, "scope": "admin", "keyId": None, "keyName": None})
    secret = request.headers.get("authorization", "").partition(" ")[2].strip()
    key = await request.app.state.keys.lookup(secret)  # the guard accepted it just now
    if key is None:  # revoked in between
        return problem(401, "unknown or revoked API key")
    return JSON({"auth": True, "scope": key.scope, "keyId": key.id, "keyName": key.name})


async def metrics_endpoint(request: Request) -> Response:
    client = request.app.state.client
    cluster = await client.run(op_cluster(client))
    return Response(metrics.render(cluster), media_type=metrics.CONTENT_TYPE_LATEST)


async def to_dashboard(request: Request) -> Response:
    """/ui -> /ui/, relative: the Location never repeats the Host header a client sent."""
    query = request.url.query
    return RedirectResponse("ui/" + (f"?{query}" if query else ""), 308)


def routes(*, metrics_auth: bool = False) -> list[BaseRoute]:
    """What create_app adds: /ui (+ /ui/session) and /metrics (behind a read key if asked)."""
    return [
        Route("/metrics", protect(metrics_endpoint, "read" if metrics_auth else None),
              methods=["GET"]),
        Route("/ui", to_dashboard, methods=["GET"]),
        Route("/ui/session", protect(session, "read"), methods=["GET"]),
        Mount("/ui", StaticFiles(packages=[("rsched.api", "static")], html=True), name="ui"),
    ]


__all__ = ["routes"]
