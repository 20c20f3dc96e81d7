"""Opaque page cursors and page-size checks: one scheme for every paged read (Redis and
archive).  A cursor is the page's position as compact JSON, base64url without padding."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from rsched.core.errors import ValidationError

MAX_PAGE = 1000  # items per page at most
_INT64 = 2**63 - 1


def encode_cursor(value: Any) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, check: Callable[[Any], bool]) -> Any:
    """The value inside a cursor encode_cursor made (None for no cursor); ``check(value)`` says
    if its shape is right.  ValidationError("cursor") for anything else."""
    if cursor is None or cursor == "":
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if check(value):
            return value
    except (ValueError, TypeError):
        pass
    raise ValidationError("cursor", "not a cursor returned by this API")


def is_int64_key(value: Any, n: int) -> bool:
    """A list of ``n`` integers that each fit a bigint (an archive row's sort key)."""
    return isinstance(value, list) and len(value) == n and all(
        type(v) is int and -_INT64 <= v <= _INT64 for v in value)


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ValidationError("limit", f"must be an integer between 1 and {MAX_PAGE}")
    return limit
