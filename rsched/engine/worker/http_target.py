"""The built-in handler of HTTP target jobs (``rsched worker --http``; docs/http-targets.md):
one pooled aiohttp session per worker process, every request signed and every address it
connects to checked by the SSRF guard first."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from rsched.core.errors import ValidationError
from rsched.core.handlers import App, AttemptFailed, JobContext, Registered
from rsched.core.http_guard import Guard
from rsched.core.http_target import (
    HTTP_TYPE,
    MAX_REDIRECTS,
    MAX_RESPONSE_BYTES,
    RESULT_BODY_BYTES,
    RETRY_AFTER_STATUSES,
    SIGNATURE_HEADER,
    body_excerpt,
    outcome_of,
    parse_secrets,
    retry_after_s,
    signature,
    unwrap,
)
from rsched.core.times import ms_to_iso
from rsched.obs.metrics import HTTP_LATENCY, HTTP_REQUESTS, export_http

VERSION = metadata.version("rsched")  # the engine may not import the package root
REDIRECTS = frozenset({301, 302, 303, 307, 308})
TO_GET = frozenset({301, 302, 303})  # become GET without a body, as browsers do
CROSS_ORIGIN_DROPPED = ("authorization", "cookie")  # not sent on to another origin
CHUNK = 64 * 1024


class Refused(Exception):
    """The SSRF guard refused an address, a scheme or a URL: a final failure."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """The worker's HTTP target settings, from its environment: RSCHED_HTTP_SIGNING_SECRETS (a
    comma list, newest first; none: no signature), RSCHED_HTTP_ALLOW and RSCHED_HTTP_DENY (the
    SSRF guard's exceptions and additions)."""

    secrets: tuple[str, ...] = ()
    guard: Guard = Guard()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> HttpSettings:
        """ValidationError naming the variable for a bad entry."""
        return cls(parse_secrets(env.get("RSCHED_HTTP_SIGNING_SECRETS")),
                   Guard.of(env.get("RSCHED_HTTP_ALLOW"), env.get("RSCHED_HTTP_DENY")))


class GuardedResolver(AbstractResolver):
    """Resolves a host once and hands aiohttp only addresses the guard passed, so the
    connection goes to a checked address (no second lookup a rebinding DNS could answer
    otherwise); any refused address refuses the host."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        for r in found:
            why = self.guard.refusal(host, ipaddress.ip_address(r["host"]), port)
            if why is not None:
                raise Refused(why)
        return found

    async def close(self) -> None:
        await self.inner.close()


class HttpTargets:
    """The ``http`` job type's handler: sends a run's request and turns the response into its
    result or an AttemptFailed (retryable, with Retry-After, or final)."""

    def __init__(self, settings: HttpSettings, concurrency: int) -> None:
        self.settings = settings
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None
        export_http()

    def session(self) -> aiohttp.ClientSession:
        """The pooled session, made in the worker's event loop on first use."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.concurrency, resolver=GuardedResolver(self.settings.guard),
                use_dns_cache=False)  # every new connection resolves and checks afresh
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent",),
                timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def register(self, app: App) -> App:
        """A copy of ``app`` with this handler for job type ``http`` (an app's own handler of
        that type is refused: the type is rsched's)."""
        if HTTP_TYPE in app.handlers:
            raise ValidationError("http", f"app {app.name!r} registers a handler for job type "
                                  f"{HTTP_TYPE!r}, which --http serves")
        out = App(app.name)
        out.handlers = {**app.handlers, HTTP_TYPE: Registered(self.__call__, True)}
        return out

    async def __call__(self, ctx: JobContext) -> dict[str, Any]:
        target, payload = unwrap(ctx.payload)
        if target is None:
            raise AttemptFailed("an http job's payload holds no target", final=True)
        url, method = str(target["url"]), str(target.get("method", "POST"))
        value = target["body"] if "body" in target else payload
        body = None if value is None else json.dumps(value, separators=(",", ":")).encode()
        timeout = float(target.get("timeoutSeconds", 30))
        t0 = time.perf_counter()
        status_class = "error"
        try:
            async with asyncio.timeout(timeout):
                status, headers, raw = await self._send(ctx, method, url,
                                                        dict(target.get("headers") or {}), body)
            status_class = f"{status // 100}xx"
        except TimeoutError:
            raise AttemptFailed(f"timed out after {timeout:g} s: {method} {url}") from None
        except Refused as e:
            raise AttemptFailed(f"refused by the SSRF guard: {e}", final=True) from None
        except aiohttp.ClientError as e:
            raise AttemptFailed(f"connection error: {type(e).__name__}: {e}") from None
        finally:
            latency = time.perf_counter() - t0
            HTTP_REQUESTS.labels(ctx.queue, status_class).inc()
            HTTP_LATENCY.labels(ctx.queue).observe(latency)
        latency_ms = round(latency * 1000)
        excerpt = body_excerpt(raw)
        outcome = outcome_of(status)
        if outcome == "ok":
            return {"status": status, "latencyMs": latency_ms, "body": excerpt}
        said = f"HTTP {status} from {method} {url}: {excerpt}"
        if outcome == "final":
            raise AttemptFailed(said, final=True)
        wait = (retry_after_s(headers.get("Retry-After"), time.time())
                if status in RETRY_AFTER_STATUSES else None)
        raise AttemptFailed(said, retry_after=wait)

    async def _send(self, ctx: JobContext, method: str, url: str, user: dict[str, str],
                    body: bytes | None) -> tuple[int, Mapping[str, str], bytes]:
        """The request, its redirects followed (each hop checked): the final response's
        status, headers and first RESULT_BODY_BYTES of body."""
        for _ in range(MAX_REDIRECTS + 1):
            host, port = self._check_url(url)
            own = self._headers(ctx, body)  # win over a user header of the same name
            taken = {k.lower() for k in own}
            headers = {k: v for k, v in user.items() if k.lower() not in taken} | own
            async with self.session().request(method, url, headers=headers, data=body,
                                              allow_redirects=False) as resp:
                location = resp.headers.get("Location")
                if resp.status in REDIRECTS and location:
                    nxt = urljoin(url, location)
                    if resp.status in TO_GET and method != "HEAD":
                        method, body = "GET", None
                    if urlsplit(nxt)[:2] != urlsplit(url)[:2] or urlsplit(nxt).port != port:
                        user = {k: v for k, v in user.items()
                                if k.lower() not in CROSS_ORIGIN_DROPPED}
                    url = nxt
                    continue
                return resp.status, resp.headers, await _read_capped(resp)
        raise Refused(f"more than {MAX_REDIRECTS} redirects, the last to {url}")

    def _check_url(self, url: str) -> tuple[str, int]:
        """Scheme, user info and an address literal checked here (aiohttp asks no resolver for
        a literal); a host name is checked by GuardedResolver.  Returns (host, port)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise Refused(f"scheme {parts.scheme!r} of {url}: only http and https")
        if "@" in parts.netloc or not parts.hostname:
            raise Refused(f"{url}: no user info, and a host")
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host, port
        why = self.settings.guard.refusal(host, address, port)
        if why is not None:
            raise Refused(why)
        return host, port

    def _headers(self, ctx: JobContext, body: bytes | None) -> dict[str, str]:
        """rsched's own headers of one request (signed over ``body``, b'' for none)."""
        h = {"User-Agent": f"rsched/{VERSION}", "Rsched-Job-Id": ctx.job_id,
             "Rsched-Run-Id": ctx.run_id, "Rsched-Attempt": str(ctx.attempt),
             "Rsched-Scheduled-At": ms_to_iso(ctx.scheduled_ms) or ""}
        if body is not None:
            h["Content-Type"] = "application/json"
        sig = signature(self.settings.secrets, int(time.time()), body or b"")
        if sig is not None:
            h[SIGNATURE_HEADER] = sig
        return h


async def _read_capped(resp: aiohttp.ClientResponse) -> bytes:
    """The body's first RESULT_BODY_BYTES; the rest is read and dropped, chunk by chunk, and
    past MAX_RESPONSE_BYTES the attempt fails (nothing larger is held)."""
    kept, total = b"", 0
    while chunk := await resp.content.read(CHUNK):
        total += len(chunk)
        if total > MAX_RESPONSE_BYTES:
            raise AttemptFailed(f"HTTP {resp.status}: the response body is over "
                                f"{MAX_RESPONSE_BYTES:,} bytes (the limit)")
        if len(kept) < RESULT_BODY_BYTES:
            kept += chunk[: RESULT_BODY_BYTES - len(kept)]
    return kept


__all__ = ["GuardedResolver", "HttpSettings", "HttpTargets", "Refused"]
