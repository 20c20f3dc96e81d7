"""`rsched api --dev-echo` (what `rsched dev` runs): /dev/echo, a receiver for the sample HTTP
target job (docs/http-targets.md), open to all, that answers with what it got.  Not for
production: it is off unless asked for, and the flag is hidden."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rsched.api.problems import JSON

ECHO_PATH = "/dev/echo"
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


async def echo(request: Request) -> Response:
    """The request's method, its Rsched-* headers (the signature among them) and body size."""
    body = await request.body()
    return JSON({"method": request.method, "bodyBytes": len(body),
                 "rschedHeaders": {k: v for k, v in request.headers.items()
                                   if k.lower().startswith("rsched-")}})


def echo_routes() -> list[BaseRoute]:
    return [Route(ECHO_PATH, echo, methods=METHODS)]


__all__ = ["ECHO_PATH", "echo_routes"]
