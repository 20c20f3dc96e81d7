"""Script calls held against their script's header (lua/<name>.lua): every KEYS[i] the header
lists matches the key built there, every ARGV[i] carries the value its label names.  Used by the
unit tests of rdb's call builders (tests/unit/test_script_calls.py, test_engine_script_calls.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rsched.rdb import keys

LUA = Path(__file__).resolve().parents[2] / "lua"


def header(name: str) -> str:
    return (LUA / f"{name}.lua").read_text().split("]]", 1)[0]


def key_pattern(pattern: str, p: int) -> re.Pattern[str]:
    """A header's key pattern (rsched:{pN}:job:<id>) as a regex for partition ``p``'s keys."""
    parts = re.split(r"(\{pN\}|<[^>]+>)", pattern)
    return re.compile("".join(re.escape(keys.tag(p)) if x == "{pN}" else
                              ".+" if x.startswith("<") else re.escape(x) for x in parts))


_PATTERN = re.compile(r"rsched:(?:[^\s<,]|<[^>]+>)+")


def listed(text: str, what: str) -> dict[int, str]:
    """KEYS[i] or ARGV[i] (fixed i only) of a header -> what follows it on its line."""
    return {int(i): line.strip() for i, line in
            re.findall(rf"{what}\[(\d+)\]\s+(.+?)(?=\s+(?:KEYS|ARGV)\[|\n|$)", text)}


def check_keys(name: str, built: list[str], p: int) -> dict[int, str]:
    """Each KEYS[i] of the header matches ``built[i - 1]``."""
    found = listed(header(name), "KEYS")
    assert found, f"{name}.lua's header lists no KEYS"
    for i, text in found.items():
        pattern = _PATTERN.match(text)
        assert pattern, f"{name}.lua's KEYS[{i}] names no key pattern"
        assert key_pattern(pattern.group(), p).fullmatch(built[i - 1]), (name, i, built)
    return found


def check_args(name: str, args: list[Any], expected: dict[str, Any]) -> dict[int, str]:
    """Each expected label (the start of an ARGV's description in the header) at its index."""
    found = listed(header(name), "ARGV")
    for label, value in expected.items():
        at = [i for i, text in found.items() if re.match(re.escape(label) + r"(?!\w)", text)]
        assert len(at) == 1, f"{name}.lua's header has no single ARGV labelled {label!r}"
        assert args[at[0] - 1] == value, (name, label, args)
    return found


def keys_after(name: str, heading: str) -> list[str]:
    """The key patterns the header lists after ``heading`` (per-run keys), up to its ARGV."""
    found = re.search(re.escape(heading) + r"(.*?)\nARGV", header(name), re.S)
    assert found, f"{name}.lua's header no longer lists {heading!r}"
    return _PATTERN.findall(found.group(1))


def match(patterns: list[str], built: list[str], p: int) -> bool:
    """Whether each built key matches its pattern, one to one."""
    return len(patterns) == len(built) and all(
        key_pattern(pat, p).fullmatch(key) for pat, key in zip(patterns, built, strict=True))
