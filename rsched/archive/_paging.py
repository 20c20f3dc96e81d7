"""Opaque page cursors and page-size checks of the archive's read functions."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rsched.core.errors import ValidationError

MAX_LIMIT = 1000
# Three integers that fit a bigint (ASCII digits only: str.isdigit accepts "²", int() does not).
_CURSOR = re.compile(r"-?[0-9]{1,18}\.-?[0-9]{1,18}\.-?[0-9]{1,18}")


def encode_cursor(key: Sequence[int]) -> str:
    return ".".join(str(k) for k in key)


def decode_cursor(cursor: str) -> tuple[int, int, int]:
    """The key a cursor holds; ValidationError("cursor") for anything this module did not make."""
    if not _CURSOR.fullmatch(cursor):
        raise ValidationError("cursor", "not a cursor returned by a previous page")
    a, b, c = cursor.split(".")
    return int(a), int(b), int(c)


def check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be an integer between 1 and {MAX_LIMIT}")
