"""The API-key guard every endpoint sits behind: `protect(endpoint, scope)` checks the Bearer
key's scope and turns any error into problem+json."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from rsched.aclient import AsyncClient
from rsched.api.problems import error_response, problem
from rsched.rdb.setup import is_unavailable
from rsched.service import apikeys

Endpoint = Callable[[Request], Awaitable[Response]]


class KeyCache:
    """Bearer secret -> ApiKey (or None), remembered for ``ttl_s``: a revoked key stops working
    within that time, and a burst of requests costs one Redis lookup per key."""

    def __init__(self, client: AsyncClient, ttl_s: float, max_entries: int = 10_000) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._seen: dict[str, tuple[float, apikeys.ApiKey | None]] = {}

    async def lookup(self, secret: str) -> apikeys.ApiKey | None:
        now = time.monotonic()
        hit = self._seen.get(secret)
        if hit is not None and hit[0] > now:
            return hit[1]
        key = await self.client.run(apikeys.op_lookup(secret))
        if len(self._seen) >= self.max_entries:
            self._seen.clear()
        self._seen[secret] = (now + self.ttl_s, key)
        return key


async def _check_key(request: Request, scope: str) -> Response | None:
    """None when the request's key may use ``scope``, else the 401/403 answer."""
    header = request.headers.get("authorization", "")
    kind, _, secret = header.partition(" ")
    secret = secret.strip()
    challenge = {"WWW-Authenticate": 'Bearer realm="rsched"'}
    if kind.lower() != "bearer" or not secret:
        return problem(401, "missing API key: send Authorization: Bearer <key>", headers=challenge)
    key = await request.app.state.keys.lookup(secret)
    if key is None:
        return problem(401, "unknown or revoked API key", headers=challenge)
    if not key.allows(scope):
        return problem(403, f"API key {key.id!r} has scope {key.scope!r}; this needs {scope!r}")
    request.state.api_key = key  # who did it, for what records its actor (dead-letter deletes)
    return None


def protect(endpoint: Endpoint, scope: str | None) -> Endpoint:
    """Wrap an endpoint: check the key's scope (when auth is on), map every error to a problem."""

    async def guarded(request: Request) -> Response:
        try:
            if scope is not None and request.app.state.auth:
                denied = await _check_key(request, scope)
                if denied is not None:
                    return denied
            res = await endpoint(request)
        except Exception as exc:  # noqa: BLE001 - every error becomes problem+json
            if is_unavailable(exc):
                request.app.state.outage.down(exc, logged=True)  # error_response logs it
            return error_response(exc)
        if scope is not None:  # the open routes (health) may not have asked Redis anything
            request.app.state.outage.up()
        return res

    guarded.__name__ = getattr(endpoint, "__name__", "endpoint")
    return guarded


__all__ = ["Endpoint", "KeyCache", "protect"]
