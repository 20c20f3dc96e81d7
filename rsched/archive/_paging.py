"""Opaque page cursors and page-size checks of the archive's read functions."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ValidationError

MAX_LIMIT = 1000


def encode_cursor(key: Sequence[int]) -> str:
    return ".".join(str(k) for k in key)


def decode_cursor(cursor: str) -> tuple[int, int, int]:
    """The key a cursor holds; ValidationError("cursor") for anything this module did not make."""
    parts = cursor.split(".")
    if len(parts) != 3 or not all(p.lstrip("-").isdigit() for p in parts):
        raise ValidationError("cursor", "not a cursor returned by a previous page")
    return int(parts[0]), int(parts[1]), int(parts[2])


def check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be an integer between 1 and {MAX_LIMIT}")
