"""The archive's page cursors: a row's three-integer sort key in core.cursor's one scheme."""

from __future__ import annotations

from collections.abc import Sequence

from rsched.core.cursor import MAX_PAGE, check_limit, decode_cursor, encode_cursor, is_int64_key

MAX_LIMIT = MAX_PAGE


def encode_key(key: Sequence[int]) -> str:
    return encode_cursor(list(key))


def decode_key(cursor: str) -> tuple[int, int, int]:
    """The key a cursor holds; ValidationError("cursor") for anything encode_key did not make."""
    a, b, c = decode_cursor(cursor, lambda v: is_int64_key(v, 3))
    return a, b, c


__all__ = ["MAX_LIMIT", "check_limit", "decode_key", "encode_key"]
