"""Loads the Lua scripts shipped in the package and calls them by SHA, reloading on NOSCRIPT.

Scripts cached by SCRIPT LOAD vanish when Redis restarts, so every call path (single call or
pipeline, sync or asyncio) falls back to loading the script and retrying once.  All scripts are
safe to apply twice, which is what makes that retry (and redis-py's own connection retries) safe.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

_INCLUDE = re.compile(r"^--!include (\w+)\s*$", re.M)

NAMES = (
    "schedule", "lease", "claim", "start", "heartbeat", "complete",
    "pause", "resume", "cancel", "replay", "trigger", "update",
)


def _lua_dir() -> Any:
    """The packaged scripts (rsched.lua) or, in a source checkout, the repo's lua/ folder."""
    try:
        return resources.files("rsched.lua")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "lua"


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


@cache
def load(name: str) -> Script:
    """Read lua/<name>.lua and inline its `--!include x` lines from lua/include/x.lua."""
    base = _lua_dir()
    text = base.joinpath(f"{name}.lua").read_text()

    def inline(m: re.Match[str]) -> str:
        # One segment per joinpath: an installed wheel gives a MultiplexedPath (rsched.lua has
        # no __init__.py), whose joinpath takes a single argument on Python 3.11.
        return str(base.joinpath("include").joinpath(f"{m.group(1)}.lua").read_text())

    source = _INCLUDE.sub(inline, text)
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, NoScriptError) or (
        isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT")
    )


def call(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run a script on a sync client."""
    s = load(name)
    try:
        return r.evalsha(s.sha, len(keys), *keys, *args)
    except NoScriptError:
        r.script_load(s.source)
        return r.evalsha(s.sha, len(keys), *keys, *args)


async def acall(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run a script on an asyncio client."""
    s = load(name)
    try:
        return await r.evalsha(s.sha, len(keys), *keys, *args)
    except NoScriptError:
        await r.script_load(s.source)
        return await r.evalsha(s.sha, len(keys), *keys, *args)


Call = tuple[str, Sequence[str], Sequence[Any]]


def call_many(r: Any, calls: Sequence[Call]) -> list[Any]:
    """Run several scripts in one pipeline (one round trip); exceptions are returned in place."""
    if not calls:
        return []
    results = _pipe(r, calls)
    redo = [i for i, res in enumerate(results) if _is_noscript(res)]
    if redo:
        for name in {calls[i][0] for i in redo}:
            r.script_load(load(name).source)
        for i, res in zip(redo, _pipe(r, [calls[i] for i in redo]), strict=False):
            results[i] = res
    return results


def _pipe(r: Any, calls: Sequence[Call]) -> list[Any]:
    p = r.pipeline(transaction=False)
    for name, keys, args in calls:
        p.evalsha(load(name).sha, len(keys), *keys, *args)
    return list(p.execute(raise_on_error=False))


async def acall_many(r: Any, calls: Sequence[Call]) -> list[Any]:
    """Asyncio twin of call_many."""
    if not calls:
        return []
    results = await _apipe(r, calls)
    redo = [i for i, res in enumerate(results) if _is_noscript(res)]
    if redo:
        for name in {calls[i][0] for i in redo}:
            await r.script_load(load(name).source)
        for i, res in zip(redo, await _apipe(r, [calls[i] for i in redo]), strict=False):
            results[i] = res
    return results


async def _apipe(r: Any, calls: Sequence[Call]) -> list[Any]:
    p = r.pipeline(transaction=False)
    for name, keys, args in calls:
        p.evalsha(load(name).sha, len(keys), *keys, *args)
    return list(await p.execute(raise_on_error=False))
