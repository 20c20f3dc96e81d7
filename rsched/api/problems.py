"""JSON in and out: request bodies read with a size limit, responses that always serialize, and
errors as RFC 9457 problem details that name the field and the reason."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import orjson
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.requests import Request
from starlette.responses import Response

from rsched.core.errors import (
    Conflict,
    NotFound,
    NotReplicated,
    PayloadTooLarge,
    RschedError,
    UnsafeRedis,
    ValidationError,
    VersionMismatch,
)
from rsched.core.values import jsonable

log = logging.getLogger("rsched.api")

PROBLEM = "application/problem+json"


class MalformedBody(RschedError):
    """The request body is not JSON (400)."""


class BodyTooLarge(RschedError):
    """The request body is over the route's limit (413)."""


def dumps(content: Any) -> bytes:
    """orjson (several times faster than json on a batch of 1,000 jobs); what it refuses
    (bytes, non-string keys, integers past 64 bits, nesting past its limit) goes through
    jsonable and json, so an answer always encodes."""
    try:
        return orjson.dumps(content)
    except TypeError as e:
        if "ecursion" in str(e):  # orjson: "Recursion limit reached"
            log.warning("an answer nested too deep (%s); the deep parts shown as placeholders", e)
        text = json.dumps(jsonable(content), ensure_ascii=False, separators=(",", ":"))
        return text.encode()


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


class Problem(JSON):
    media_type = PROBLEM


_TITLES = {
    400: "Malformed request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
    405: "Method not allowed", 409: "Conflict", 412: "Precondition failed",
    413: "Content too large", 422: "Invalid request", 500: "Internal error",
    503: "Service unavailable", 504: "Applied, not confirmed",
}
_SLUGS = {
    400: "malformed-json", 401: "unauthorized", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 409: "conflict", 412: "version-mismatch", 413: "too-large",
    422: "validation",
    500: "internal", 503: "unavailable", 504: "not-confirmed",
}
UNCONFIRMED = 504
"""A write applied on the primary that its replicas did not confirm in time (NotReplicated):
like a gateway's 504, the outcome stands unless a failover undoes it, and no Retry-After
invites a retry, which only the same idempotency key makes safe (docs/redis.md)."""
RETRY_AFTER_S = 1  # a 503 (Redis away): when to try again


def problem_body(status: int, detail: str, field: str | None = None,
                 reason: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"urn:rsched:problem:{_SLUGS.get(status, 'error')}",
        "title": _TITLES.get(status, "Error"), "status": status, "detail": detail,
    }
    if field is not None:
        body["errors"] = [{"field": field, "reason": reason or detail}]
    return body


def problem(status: int, detail: str, field: str | None = None, reason: str | None = None,
            headers: dict[str, str] | None = None) -> Problem:
    return Problem(problem_body(status, detail, field, reason), status, headers)


def classify(exc: Exception) -> dict[str, Any]:
    """The problem body for an error rsched raises on purpose (or for Redis being away)."""
    if isinstance(exc, PayloadTooLarge):
        return problem_body(413, str(exc), exc.field, exc.reason)
    if isinstance(exc, VersionMismatch):
        return problem_body(412, str(exc), exc.field, exc.reason)
    if isinstance(exc, (ValidationError, Conflict)):
        return problem_body(422 if isinstance(exc, ValidationError) else 409, str(exc),
                            exc.field, exc.reason)
    if isinstance(exc, NotFound):
        return problem_body(404, str(exc))
    if isinstance(exc, MalformedBody):
        return problem_body(400, str(exc), "body", str(exc).removeprefix("body: "))
    if isinstance(exc, BodyTooLarge):
        return problem_body(413, str(exc), "body", str(exc).removeprefix("body: "))
    if isinstance(exc, NotReplicated):
        log.warning("write not confirmed: %s", exc)
        return problem_body(UNCONFIRMED, str(exc))
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, UnsafeRedis, ClusterDownError,
                        TryAgainError)):
        log.warning("redis unavailable: %s", exc)
        return problem_body(503, f"Redis is unavailable: {exc}")
    if isinstance(exc, RecursionError):  # its traceback repeats one frame a thousand times
        log.error("unexpected error: RecursionError: %s", exc)
    else:
        log.exception("unexpected error", exc_info=exc)
    return problem_body(500, f"internal error ({type(exc).__name__}); see the server log")


def error_response(exc: Exception) -> Problem:
    body = classify(exc)
    retry = {"Retry-After": str(RETRY_AFTER_S)} if body["status"] == 503 else None
    return Problem(body, body["status"], retry)


def if_match(request: Request) -> int | None:
    """The If-Match header as a job version (a quoted ETag-style value is accepted)."""
    raw = request.headers.get("if-match")
    if raw is None:
        return None
    text = raw.strip().removeprefix("W/").strip('"')
    if not text.isdigit() or not 1 <= len(text) <= 18:
        raise ValidationError("If-Match", f"expected a job version (an integer), got {raw!r}")
    return int(text)


def idempotency_key(request: Request, body_key: str | None) -> str | None:
    """The job's idempotency key: the Idempotency-Key header (Stripe's convention) or the
    body's idempotencyKey; both given and different is refused (422), never one picked."""
    raw = request.headers.get("idempotency-key")
    if raw is None:
        return body_key
    if not 1 <= len(raw) <= 255:
        raise ValidationError("Idempotency-Key", "must be 1-255 characters")
    if body_key is not None and body_key != raw:
        raise ValidationError("Idempotency-Key", "differs from the body's idempotencyKey: give "
                              "one of them, or the same key in both")
    return raw


async def read_json(request: Request, limit: int) -> Any:
    """The parsed body; BodyTooLarge past ``limit`` bytes, MalformedBody when not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body: {declared} bytes, over the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"body: over the limit of {limit} bytes")
    if not body.strip():
        raise MalformedBody("body: empty; expected a JSON object")
    try:  # orjson refuses NaN and Infinity (not JSON), bad UTF-8 and nesting past 1024
        value = orjson.loads(body)
    except ValueError as e:  # orjson.JSONDecodeError is one
        raise MalformedBody(f"body: malformed JSON: {e}") from None
    if _LONG_NUMBER.search(body) or not _keys_unique(body, value):
        return _exact(body)
    return value


# orjson turns an integer beyond 64 bits into a float, silently; any such integer has 19 digits.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def _keys_unique(body: bytes | bytearray, value: Any) -> bool:
    """True if no object of the body holds a key twice (orjson keeps the last one, silently);
    False if it may.  Without a \\u escape, a colon in the body is a member's or a string's own,
    and orjson writes every colon as is: a key given twice drops a member, and with it a colon
    at least, from ``value`` encoded again.  Costs one encode and two counts at C speed."""
    if b"\\u" in body:
        return False
    try:
        again = orjson.dumps(value)
    except TypeError:  # nested past the encoder's limit: json decides
        return False
    return again.count(b":") == body.count(b":")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: an object, or MalformedBody naming the key given twice."""
    d = dict(pairs)
    if len(d) < len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise MalformedBody(f"body: duplicate key {json.dumps(k)[:100]} in an object; "
                                    "give each key once")
            seen.add(k)
    return d


def _exact(body: bytes | bytearray) -> Any:
    """The body parsed again by json, which keeps every integer exactly (so that validation
    refuses one beyond 64 bits naming its field) and refuses a key given twice in an object.
    orjson accepted it: only the depth (Python's recursion limit sits below orjson's 1,024) or
    a duplicate key can fail here."""
    try:
        return json.loads(body, object_pairs_hook=_unique)
    except RecursionError:
        raise MalformedBody("body: nested too deeply") from None
