"""The values callers store, payloads and handler results: their nesting bound, and the safe
way to read one back.

A value nested deeper than VALUE_DEPTH is refused when written (naming the field).  One that is
stored all the same (by older code, or written straight into Redis) or cannot be decoded at all
is read back as an Unreadable placeholder naming the problem, logged in one line: a stored value
never makes a read fail, so one job cannot break a listing for every caller.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from itertools import chain
from typing import Any

import msgpack

from rsched.core.defaults import VALUE_DEPTH
from rsched.core.errors import ValidationError

log = logging.getLogger("rsched")

_NESTED = (dict, list, tuple)
_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))
TOO_DEEP = f"nested more than {VALUE_DEPTH} levels deep (arrays and objects)"


class Unreadable(dict[str, str]):
    """What a stored value that cannot be shown reads as: ``{"$unreadable": "<problem>"}``,
    a dict so that every encoder takes it; its type tells it from a caller's own value."""

    def __init__(self, problem: str) -> None:
        super().__init__({"$unreadable": problem})


def too_deep(value: Any, limit: int = VALUE_DEPTH) -> bool:
    """True if ``value`` nests arrays and objects (dict keys included) more than ``limit``
    deep.  Level by level; for a tree (what JSON and msgpack decode to, or what encoded
    without error), so a walk costs a few comprehension steps per element."""
    level = [value] if isinstance(value, _NESTED) else []
    for _ in range(limit):
        level = [x for c in level for x in (chain(c, c.values()) if isinstance(c, dict) else c)
                 if x.__class__ not in _SCALARS and isinstance(x, _NESTED)]
        if not level:
            return False
    return bool(level)


# msgpack's container headers (fixmap, fixarray, array 16/32, map 16/32) as 1, other bytes 0:
# a value's count of them bounds its depth from above, at C speed.
_HEADERS = bytes(1 if 0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF else 0 for b in range(256))


def shallow_msgpack(raw: bytes) -> bool:
    """True if the value ``raw`` encodes surely nests within VALUE_DEPTH: every container has a
    header byte, so few such bytes (most payloads) need no walk."""
    return len(raw) <= VALUE_DEPTH or raw.translate(_HEADERS).count(1) <= VALUE_DEPTH


def shallow_json(text: str | bytes) -> bool:
    """As shallow_msgpack for JSON text: few opening brackets."""
    if len(text) <= VALUE_DEPTH:
        return True
    if isinstance(text, str):
        return text.count("[") + text.count("{") <= VALUE_DEPTH
    return text.count(b"[") + text.count(b"{") <= VALUE_DEPTH


def check_depth(value: Any, field: str, packed: bytes | None = None) -> None:
    """ValidationError naming ``field`` if ``value`` nests too deep; ``packed``, its msgpack
    form if known, spares most values the walk (shallow_msgpack)."""
    if (packed is None or not shallow_msgpack(packed)) and too_deep(value):
        raise ValidationError(field, f"{TOO_DEEP}; the limit is {VALUE_DEPTH}")


def unreadable(where: str, problem: str) -> Unreadable:
    """The placeholder for the stored value ``where`` names, the problem logged in one line."""
    log.warning("%s: unreadable stored value (%s); shown as a placeholder", where, problem)
    return Unreadable(problem)


def reason(e: BaseException) -> str:
    """An error in a few words for a log line or a placeholder."""
    return f"{type(e).__name__}: {str(e)[:200]}"


def read_msgpack(raw: bytes, where: str) -> Any:
    """A stored msgpack value (a payload) decoded, or an Unreadable; ``where`` names it in the
    log line (``job 3-abc payload``)."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except msgpack.StackError:  # deeper than the decoder's own stack
        return unreadable(where, TOO_DEEP)
    except Exception as e:  # noqa: BLE001 - any undecodable value reads as a placeholder
        return unreadable(where, "not valid msgpack: " + reason(e))
    if not shallow_msgpack(raw) and too_deep(value):
        return unreadable(where, TOO_DEEP)
    return value


def read_json(text: str | bytes, where: str) -> Any:
    """A stored JSON value (a result) decoded, or an Unreadable; as read_msgpack."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        return unreadable(where, ("not valid JSON: " + reason(e)) if isinstance(e, ValueError)
                           else TOO_DEEP)
    if not shallow_json(text) and too_deep(value):
        return unreadable(where, TOO_DEEP)
    return value


def jsonable(value: Any, depth: int = 0) -> Any:
    """What json.dumps cannot take, made JSON: bytes as base64, NaN as null, keys as strings,
    a part nested more than twice VALUE_DEPTH deep as an Unreadable (no caller's value nests so
    deep once read: core.models), so the result always encodes.

    Only payloads scheduled from Python can hold such values; HTTP callers send JSON."""
    if isinstance(value, (dict, list, tuple)) and depth >= 2 * VALUE_DEPTH:
        return Unreadable(TOO_DEEP)
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(jsonable(k, depth + 1)): jsonable(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


__all__ = ["TOO_DEEP", "VALUE_DEPTH", "Unreadable", "check_depth", "jsonable", "read_json",
           "read_msgpack", "reason", "shallow_json", "shallow_msgpack", "too_deep",
           "unreadable"]
