"""Loads the Lua scripts shipped in the package and calls them by SHA, reloading on NOSCRIPT.

Scripts cached by SCRIPT LOAD vanish when Redis restarts, so every call path (single call or
pipeline, sync or asyncio) falls back to loading the script and retrying once.  All scripts are
safe to apply twice, which is what makes that retry (and redis-py's own connection retries) safe.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
        return Path(__file__).resolve().parents[2] / "lua"


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


def call_many(r: Any, calls: Iterable[Call]) -> list[Any]:
    """Run several scripts in one pipeline (one round trip); exceptions are returned in place."""
    todo = list(calls)
    if not todo:
        return []
    return _redo_noscript(r, todo, _pipe(r, todo))


def _redo_noscript(r: Any, calls: Sequence[Call], results: list[Any]) -> list[Any]:
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


def stream_many(r: Any, calls: Iterable[Call]) -> list[Any]:
    """call_many for calls built while they run: each is written to Redis as soon as ``calls``
    yields it and the replies are read after the last, so Redis runs one call (on its own core)
    while the caller builds the next; a pipeline would wait for the last to send the first.

    A connection error anywhere sends every call again through call_many's retrying pipeline:
    scripts are safe to apply twice.  A client without a single connection pool (cluster) gets
    call_many."""
    pool = getattr(r, "connection_pool", None)
    if pool is None:
        return call_many(r, calls)
    sent: list[Call] = []
    it = iter(calls)
    conn = pool.get_connection()
    try:
        try:
            for call in it:
                sent.append(call)
                name, keys, args = call
                conn.send_packed_command(
                    conn.pack_command("EVALSHA", load(name).sha, len(keys), *keys, *args),
                    check_health=len(sent) == 1)
            results: list[Any] = []
            for _ in sent:
                try:
                    results.append(conn.read_response())
                except ResponseError as e:
                    results.append(e)
        except (RedisConnectionError, RedisTimeoutError):
            conn.disconnect()
            return call_many(r, [*sent, *it])
        except BaseException:
            conn.disconnect()  # replies may be unread: the next user must not get them
            raise
    finally:
        pool.release(conn)
    return _redo_noscript(r, sent, results)


async def acall_many(r: Any, calls: Iterable[Call]) -> list[Any]:
    """Asyncio twin of call_many."""
    todo = list(calls)
    if not todo:
        return []
    results = await _apipe(r, todo)
    redo = [i for i, res in enumerate(results) if _is_noscript(res)]
    if redo:
        for name in {todo[i][0] for i in redo}:
            await r.script_load(load(name).source)
        for i, res in zip(redo, await _apipe(r, [todo[i] for i in redo]), strict=False):
            results[i] = res
    return results


async def _apipe(r: Any, calls: Sequence[Call]) -> list[Any]:
    p = r.pipeline(transaction=False)
    for name, keys, args in calls:
        p.evalsha(load(name).sha, len(keys), *keys, *args)
    return list(await p.execute(raise_on_error=False))
