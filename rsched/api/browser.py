"""What the API does about browsers: it answers only trusted Host names (DNS rebinding), refuses
writes a page of another origin sends (cross-site requests), takes request bodies only as JSON,
and sends security headers with every answer (no framing, no sniffing, no caching).

docs/security.md, "Browsers and the dashboard", says why each is there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from rsched.api.problems import Problem, problem_body
from rsched.core import defaults

# Sent with the dashboard's and /docs' answers.  They load only their own files (no inline
# script or style), and no page may frame them: a framed, signed-in dashboard could be clicked
# on.  Every answer is also kept out of caches (answers carry jobs, payloads and keys' names).
CSP = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
API_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    *API_HEADERS,
)
PAGES = ("/ui", "/docs")  # paths whose answers a browser shows as pages

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` serves this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_hosts(bind: str) -> tuple[str, ...] | None:
    """The Host names answered when none are configured: the loopback names when bound to a
    loopback address, else any (None)."""
    if not is_loopback(bind):
        return None
    return tuple(dict.fromkeys((*defaults.LOOPBACK_HOSTS, bind.strip("[]").lower())))


def parse_hosts(values: Iterable[str]) -> tuple[str, ...]:
    """--allowed-host values (each may list several, comma-separated) as lower-case names."""
    return tuple(h.strip().lower().rstrip(".") for v in values for h in v.split(",") if h.strip())


def split_host(host: str) -> tuple[str, str | None]:
    """A Host header as (name, port or None): ``[::1]:8600`` -> ``("::1", "8600")``.  A port
    that is not digits leaves the whole header as the name, which no list holds."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
        return (name, port or None) if port.isdigit() or not rest else (host, None)
    name, sep, port = host.rpartition(":")
    if sep and ":" not in name:
        return (name.rstrip("."), port) if port.isdigit() else (host, None)
    return host.rstrip("."), None


class HostPolicy:
    """Which Host names the API answers."""

    def __init__(self, allowed: Iterable[str] | None) -> None:
        names = None if allowed is None else frozenset(allowed)
        self.any = names is None or "*" in names
        self.exact = frozenset(n for n in names or () if not n.startswith("*."))
        self.suffixes = tuple(n[1:] for n in names or () if n.startswith("*."))

    def _listed(self, name: str) -> bool:
        return name in self.exact or any(name.endswith(s) for s in self.suffixes)

    def host_allowed(self, host: str | None) -> bool:
        """A request without Host (HTTP/1.0) cannot come from a rebinding page: answered."""
        return self.any or host is None or self._listed(split_host(host)[0])


def same_origin(origin: str, host: str | None) -> bool:
    """Whether a browser page of ``origin`` is this server as the browser named it (the Host
    header, name and port): a proxy in front must pass Host on for the dashboard's writes."""
    try:
        parts = urlsplit(origin.strip().lower())
        origin_port = parts.port
    except ValueError:  # not a URL, or its port not a number
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or host is None:
        return False  # "null" (a sandboxed frame, a file) and the like
    name, port = split_host(host)
    default = _DEFAULT_PORTS[parts.scheme]
    return (name, port or default) == (parts.hostname.rstrip("."), str(origin_port or default))


def _problem(status: int, title: str, slug: str, detail: str, field: str | None = None
             ) -> Problem:
    body = problem_body(status, detail, field)
    body.update(type=f"urn:rsched:problem:{slug}", title=title)
    return Problem(body, status)


def refusal(scope: dict[str, Any], policy: HostPolicy) -> Problem | None:
    """The answer to a request from the wrong place, or None when it may go on."""
    host = origin = None
    for name, value in scope["headers"]:
        if name == b"host":
            host = value.decode("latin-1")
        elif name == b"origin":
            origin = value.decode("latin-1")
    if not policy.host_allowed(host):
        return _problem(421, "Misdirected request", "untrusted-host",
                        f"Host {host!r} is not one this server answers; list it with "
                        "--allowed-host (RSCHED_ALLOWED_HOSTS)")
    if origin is not None and scope["method"] not in _SAFE_METHODS \
            and not same_origin(origin, host):
        return _problem(403, "Forbidden", "cross-origin",
                        f"a {scope['method']} from a page of origin {origin!r} is refused: "
                        "writes come from this server's own pages or from clients that send "
                        "no Origin")
    return None


Send = Callable[[Any], Awaitable[None]]


def with_security_headers(send: Send, path: str) -> Send:
    """``send`` adding the headers an answer for ``path`` carries to the response's start
    (the API's JSON answers only those that matter to data: each header costs the server)."""
    extra = SECURITY_HEADERS if path.startswith(PAGES) else API_HEADERS

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *extra]
        await send(message)

    return sending


def is_json(content_type: str) -> bool:
    """application/json or application/<anything>+json, with parameters (charset) or not."""
    media = content_type.partition(";")[0].strip().lower()
    kind, _, sub = media.partition("/")
    return kind == "application" and (sub == "json" or sub.endswith("+json"))


def _body_of(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, bool]:
    """(Content-Type, whether a body comes), in one pass over the raw headers."""
    content_type, has_body = None, False
    for name, value in headers:
        if name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-length":
            has_body = has_body or value.strip() not in (b"0", b"")
        elif name == b"transfer-encoding":
            has_body = True
    return content_type, has_body


def json_only(endpoint: Callable[[Request], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a route that takes a body: 415 unless it is declared JSON.  A request without a body
    and without Content-Type goes through (POST /jobs/{id}/pause has an optional body).  A
    browser page sends text/plain, form or multipart bodies to any origin without asking (a
    "simple" request); JSON it may send only after a CORS preflight, which the API refuses."""

    async def checked(request: Request) -> Response:
        content_type, has_body = _body_of(request.scope["headers"])
        if (content_type is not None or has_body) and not is_json(content_type or ""):
            return _problem(415, "Unsupported media type", "not-json",
                            f"Content-Type {content_type or '(none)'} is not JSON: send the "
                            "body as application/json", "Content-Type")
        return await endpoint(request)

    checked.__name__ = getattr(endpoint, "__name__", "endpoint")
    return checked


__all__ = ["API_HEADERS", "CSP", "PAGES", "SECURITY_HEADERS", "HostPolicy", "default_hosts",
           "is_json", "is_loopback", "json_only", "parse_hosts", "refusal", "same_origin",
           "split_host", "with_security_headers"]
