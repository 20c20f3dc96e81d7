"""Flow-control limits (docs/limits.md): named definitions, validated here, and the rule that
picks a key's definition.

A definition caps the runs of one limit key: ``concurrency`` runs at once, and/or at most
``rate_limit`` starts in any window of ``period_ms`` (a sliding window on Redis's clock).  A
name ending in ``*`` is a family: it applies to every key that starts with what precedes the
``*`` and has no definition of its own, the longest such prefix winning; each key is still
counted on its own.  lua/include/limits.lua applies the same rule (``resolve`` here is its
Python twin, for reads and tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rsched.core.errors import ValidationError

MAX_NAME_CHARS = 200
MAX_CONCURRENCY = 1_000_000
MAX_PERIOD_MS = 86_400_000  # a rate's window: at most a day
MAX_RATE_LIMIT = 1_000_000_000
FAMILY = "*"

# Control characters (C0, DEL, C1): a name or key is shown and logged as text, and the
# partitions' family list joins names by '\n'.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Limit:
    """One definition: None for a cap it does not set (at least one is set)."""

    name: str
    concurrency: int | None
    rate_limit: int | None
    period_ms: int | None

    @property
    def family(self) -> bool:
        return self.name.endswith(FAMILY)

    def packed(self) -> str:
        """The form the partitions' limits hash stores and lua/include/limits.lua reads:
        'concurrency rate_limit period_ms', 0 for none."""
        return f"{self.concurrency or 0} {self.rate_limit or 0} {self.period_ms or 0}"

    @classmethod
    def unpacked(cls, name: str, text: str) -> Limit:
        c, r, p = (int(v) for v in text.split())
        return cls(name, c or None, r or None, p or None)


def _text(value: Any, field: str, stars: bool) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
        raise ValidationError(field, f"must be a string of 1-{MAX_NAME_CHARS} characters")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise ValidationError(field, f"holds the control character U+{ord(bad.group()):04X} "
                                     f"at {bad.start()}")
    if "/" in value:  # a name is one segment of the API's path (/limits/{name}); so is a key's
        raise ValidationError(field, "may not hold '/' (it names an API path segment)")
    star = value.find(FAMILY)
    if star >= 0 and not (stars and star == len(value) - 1):
        raise ValidationError(field, "a '*' may only end a limit's name (a family)" if stars
                              else "may not hold '*' (it marks a family of limit names)")
    return value


def check_name(name: Any) -> str:
    """A limit's name: 1-200 characters, no control character and no '/', '*' only at its
    end."""
    return _text(name, "name", stars=True)


def check_key(key: Any) -> str:
    """A job's limit key: 1-200 characters, no control character, no '/' and no '*'."""
    return _text(key, "limitKey", stars=False)


def _count(value: Any, field: str, hi: int) -> int:
    if type(value) is not int or not 1 <= value <= hi:
        raise ValidationError(field, f"must be an integer from 1 to {hi:,}")
    return value


def limit_of(name: Any, body: Any) -> Limit:
    """The definition a PUT's JSON body gives (``{"concurrency": N|null, "rate": {"limit": N,
    "periodSeconds": S}|null}``), every field checked; an error names the first bad one."""
    name = check_name(name)
    if not isinstance(body, Mapping):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(body) - {"concurrency", "rate"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field (give concurrency and/or rate)")
    conc = body.get("concurrency")
    if conc is not None:
        conc = _count(conc, "concurrency", MAX_CONCURRENCY)
    rate, limit, period_ms = body.get("rate"), None, None
    if rate is not None:
        if not isinstance(rate, Mapping):
            raise ValidationError("rate", "must be an object {limit, periodSeconds} or null")
        extra = sorted(set(rate) - {"limit", "periodSeconds"})
        if extra:
            raise ValidationError(f"rate.{extra[0]}", "unknown field")
        limit = _count(rate.get("limit"), "rate.limit", MAX_RATE_LIMIT)
        period_ms = period_ms_of(rate.get("periodSeconds"), "rate.periodSeconds")
    if conc is None and limit is None:
        raise ValidationError("concurrency", "give concurrency, rate or both")
    return Limit(name, conc, limit, period_ms)


def period_ms_of(seconds: Any, field: str) -> int:
    """A window in seconds (above 0, at most a day; whole milliseconds) as ms."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValidationError(field, "must be a number of seconds")
    ms = seconds * 1000
    if not 0 < ms <= MAX_PERIOD_MS:
        raise ValidationError(field, "must be above 0 and at most 86,400")
    if ms != int(ms):
        raise ValidationError(field, "must be a whole number of milliseconds")
    return int(ms)


_RATE = re.compile(r"^(\d+)/(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_MS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def rate_of_text(text: str, flag: str = "--rate") -> tuple[int, float]:
    """``10/1s``, ``600/60s``, ``5/1m``: (limit, period seconds), checked; errors name ``flag``."""
    m = _RATE.match(text.strip())
    if m is None:
        raise ValidationError(flag, f"{text!r} is not N/<period> (e.g. 10/1s or 600/60s)")
    seconds = float(m.group(2)) * _UNIT_MS[m.group(3) or "s"]
    return int(m.group(1)), int(seconds) if seconds == int(seconds) else seconds


def body_of(limit: Limit) -> dict[str, Any]:
    """The JSON form of a definition (what GET answers), without its state."""
    rate = None
    if limit.rate_limit is not None and limit.period_ms is not None:
        s = limit.period_ms / 1000
        rate = {"limit": limit.rate_limit, "periodSeconds": int(s) if s == int(s) else s}
    return {"name": limit.name, "concurrency": limit.concurrency, "rate": rate}


def families(names: Iterable[str]) -> list[str]:
    """The family names among ``names``, longest first (then by name), the order lua/limit.lua
    keeps them in: the first whose prefix a key starts with is the longest."""
    return sorted((n for n in names if n.endswith(FAMILY)), key=lambda n: (-len(n), n))


def resolver(names: Iterable[str]) -> Callable[[str], str | None]:
    """A function giving the name of the definition that applies to a key among ``names``: its
    own, else the family with the longest prefix of it, else None (the key runs unlimited)."""
    own = set(names)
    fams = [(fam[:-1], fam) for fam in families(own)]

    def resolve(key: str) -> str | None:
        if key in own:
            return key
        return next((fam for prefix, fam in fams if key.startswith(prefix)), None)

    return resolve


def resolve(key: str, names: Iterable[str]) -> str | None:
    """The name of the definition that applies to ``key`` among ``names`` (see resolver)."""
    return resolver(names)(key)


__all__ = ["FAMILY", "Limit", "body_of", "check_key", "check_name", "families", "limit_of",
           "period_ms_of", "rate_of_text", "resolve", "resolver"]
