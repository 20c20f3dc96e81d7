"""HTTP target jobs (docs/http-targets.md): the ``target`` a job of type ``http`` carries, checked
once for every face; how it is stored; and the pure parts of sending it (signature, outcome of a
status, Retry-After).  The worker's built-in handler (rsched.engine.worker.http_target) does the
I/O.

A target is stored inside the job's payload, as ``{"target": {...}, "payload": <payload>}``, so
it travels with the spec to every worker and counts against the payload limit; Job.from_hash
reads it back out (Job.target, Job.payload).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from rsched.core.errors import ValidationError

HTTP_TYPE = "http"  # the job type whose runs the built-in handler sends
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
DEFAULT_METHOD = "POST"
DEFAULT_TIMEOUT_S = 30
MAX_TIMEOUT_S = 900
MAX_URL_CHARS = 2048
MAX_HEADERS = 50
MAX_HEADER_BYTES = 16 * 1024  # names and values together
TARGET_FIELDS = ("url", "method", "headers", "body", "timeoutSeconds")
# Headers a target may not set: the transport's own, and every Rsched- header (the worker's).
FORBIDDEN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
RESERVED_PREFIX = "rsched-"
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token: a header name
SIGNATURE_HEADER = "Rsched-Signature"
SIGNING_TOLERANCE_S = 300  # what a receiver should accept of a signature's age (the docs' check)
RESULT_BODY_BYTES = 4096  # of a response's body kept as the run's result
MAX_RESPONSE_BYTES = 1 << 20  # a larger response body fails the attempt
MAX_REDIRECTS = 5
RETRY_AFTER_STATUSES = (429, 503)  # whose Retry-After the next attempt honours
RETRYABLE_4XX = (408, 429)


def check_target(value: Any, field: str = "target") -> dict[str, Any]:
    """A target as the API takes it (``url``, ``method``, ``headers``, ``body``,
    ``timeoutSeconds``), checked and filled in: method upper-cased (default POST), headers a
    dict of strings, timeoutSeconds a number in (0, 900] (default 30); ``body`` kept only when
    given (not null), else the job's payload is sent.  Each error names its field."""
    if not isinstance(value, dict):
        raise ValidationError(field, "expected a JSON object with url")
    for name in value:
        if name not in TARGET_FIELDS:
            raise ValidationError(f"{field}.{name}",
                                  "unknown field; expected one of " + ", ".join(TARGET_FIELDS))
    out: dict[str, Any] = {"url": check_url(value.get("url"), f"{field}.url")}
    method = value.get("method")
    method = DEFAULT_METHOD if method is None else method
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValidationError(f"{field}.method", "must be one of " + ", ".join(METHODS))
    out["method"] = method.upper()
    out["headers"] = check_headers(value.get("headers"), f"{field}.headers")
    timeout = value.get("timeoutSeconds")
    timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT_S):
        raise ValidationError(f"{field}.timeoutSeconds",
                              f"must be a number of seconds in (0, {MAX_TIMEOUT_S}]")
    out["timeoutSeconds"] = timeout
    if value.get("body") is not None:
        out["body"] = value["body"]
    return out


def target_of(url: str, method: str | None = None, headers: dict[str, str] | None = None,
              body: Any = None, timeout_s: float | None = None) -> dict[str, Any]:
    """A target as JobSpec(target=...) takes it, from Python's arguments (checked on schedule)."""
    out: dict[str, Any] = {"url": url, "method": method, "headers": headers,
                           "timeoutSeconds": timeout_s}
    if body is not None:
        out["body"] = body
    return out


def check_url(url: Any, field: str = "target.url") -> str:
    """An absolute http or https URL of at most 2,048 characters with a host and no user info
    (the SSRF guard checks where it leads when it is sent)."""
    if not isinstance(url, str) or not url:
        raise ValidationError(field, "required: an http or https URL")
    if len(url) > MAX_URL_CHARS:
        raise ValidationError(field, f"{len(url)} characters, over the limit of {MAX_URL_CHARS}")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValidationError(field, "holds whitespace or a control character")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number or out of range
    except ValueError as e:
        raise ValidationError(field, f"not a URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValidationError(field, f"scheme {parts.scheme or '(none)'!r}: only http and https")
    if "@" in parts.netloc:
        raise ValidationError(field, "user info (user:password@) is not allowed in the URL")
    if not parts.hostname:
        raise ValidationError(field, "has no host")
    return url


def check_headers(value: Any, field: str = "target.headers") -> dict[str, str]:
    """User headers: at most 50, 16 KiB of names and values; names are tokens and none of
    FORBIDDEN_HEADERS or Rsched-*; values strings without a line break."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(field, "expected a JSON object of header names to values")
    if len(value) > MAX_HEADERS:
        raise ValidationError(field, f"{len(value)} headers, over the limit of {MAX_HEADERS}")
    size = 0
    seen: set[str] = set()
    for name, v in value.items():
        where = f"{field}.{name}"
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValidationError(where, "a header name must be a token (letters, digits and "
                                  "!#$%&'*+-.^_`|~)")
        low = name.lower()
        if low in FORBIDDEN_HEADERS or low.startswith(RESERVED_PREFIX):
            raise ValidationError(where, "may not be set: Host, Content-Length, "
                                  "Transfer-Encoding, Connection and Rsched-* are rsched's")
        if low in seen:
            raise ValidationError(where, "given twice (header names compare case-insensitively)")
        seen.add(low)
        if not isinstance(v, str):
            raise ValidationError(where, "expected a string value")
        if "\r" in v or "\n" in v or "\0" in v:
            raise ValidationError(where, "a header value may not hold a line break or NUL")
        size += len(name.encode()) + len(v.encode())
    if size > MAX_HEADER_BYTES:
        raise ValidationError(field, f"{size} bytes of headers, over the limit of "
                              f"{MAX_HEADER_BYTES}")
    return dict(value)


def wrap(target: dict[str, Any], payload: Any) -> dict[str, Any]:
    """The payload an http job stores: its checked target and its own payload."""
    return {"target": target, "payload": payload}


def unwrap(stored: Any) -> tuple[dict[str, Any] | None, Any]:
    """(target, payload) of what an http job stores; (None, stored) for anything else."""
    if isinstance(stored, dict) and isinstance(stored.get("target"), dict):
        return stored["target"], stored.get("payload")
    return None, stored


def signature(secrets: tuple[str, ...], t: int, body: bytes) -> str | None:
    """``t=<t>,v1=<hex>`` with one v1 per secret (newest first), the HMAC-SHA256 of
    ``"<t>.<body>"``; None without secrets (no header is sent)."""
    if not secrets:
        return None
    signed = str(t).encode() + b"." + body
    return ",".join([f"t={t}"] + [
        "v1=" + hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in secrets])


def parse_secrets(text: str | None) -> tuple[str, ...]:
    """RSCHED_HTTP_SIGNING_SECRETS: a comma list, newest first; blanks ignored."""
    return tuple(s.strip() for s in (text or "").split(",") if s.strip())


def outcome_of(status: int) -> str:
    """What a final (not redirect) response's status means: 'ok' (2xx), 'retry' (408, 429,
    5xx) or 'final' (any other: the run is dead-lettered at once)."""
    if 200 <= status < 300:
        return "ok"
    if status in RETRYABLE_4XX or status >= 500:
        return "retry"
    return "final"


def retry_after_s(value: str | None, now_s: float) -> float | None:
    """A Retry-After header's wait in seconds (delta seconds or an HTTP date; a date in the
    past is 0); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(when.timestamp() - now_s, 0.0)


def body_excerpt(raw: bytes) -> str:
    """The first RESULT_BODY_BYTES of a response body as text (bytes that are no UTF-8 read
    as U+FFFD), cut further so that its JSON stays within half of a run's result limit (a body
    of escapes grows up to six times as JSON)."""
    text = raw[:RESULT_BODY_BYTES].decode("utf-8", errors="replace")
    while len(json.dumps(text)) > 2 * RESULT_BODY_BYTES:
        text = text[: len(text) * 3 // 4]
    return text


__all__ = ["DEFAULT_METHOD", "HTTP_TYPE", "MAX_HEADERS", "MAX_REDIRECTS", "MAX_RESPONSE_BYTES",
           "MAX_TIMEOUT_S", "MAX_URL_CHARS", "METHODS", "RESULT_BODY_BYTES",
           "RETRY_AFTER_STATUSES", "SIGNATURE_HEADER", "SIGNING_TOLERANCE_S", "body_excerpt",
           "check_headers", "check_target", "check_url", "outcome_of", "parse_secrets",
           "retry_after_s", "signature", "target_of", "unwrap", "wrap"]
