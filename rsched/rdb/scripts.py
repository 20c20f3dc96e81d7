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
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsched.core import defaults, layout
from rsched.rdb.cluster import is_cluster
from rsched.rdb.durable import Wait

_INCLUDE = re.compile(r"^--!include (\w+)\s*$", re.M)

NAMES = (
    "schedule", "lease", "claim", "start", "heartbeat", "complete",
    "pause", "resume", "cancel", "replay", "trigger", "update", "delete_dead", "expire", "park",
    "backfill", "dead_page", "operation_step", "operation_cancel", "limit",
    "alive", "take_over",
    "trim_streams",
    "limit_keys", "queue_permit", "queue_wake",
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


def _defaults_lua() -> str:
    """The `--!include defaults` of a script: defaults the scripts read, from core.defaults (so
    each is defined once).  Job-hash fields holding one are not stored."""
    return ("-- Defaults of job-hash fields left out when they hold them (rsched.core.defaults).\n"
            f"local DEFAULT_MAX_ATTEMPTS = {int(defaults.MAX_ATTEMPTS)}\n"
            f"local MAX_DEFERRALS = {int(defaults.MAX_DEFERRALS)}\n")


@cache
def load(name: str) -> Script:
    """Read lua/<name>.lua and inline its `--!include x` lines from lua/include/x.lua (and
    `--!include defaults` from core.defaults, `--!include layout` from core.layout), then write
    the job-hash field names J.<name> and OWN.<name> as literals (core.layout.literals)."""
    base = _lua_dir()
    text = base.joinpath(f"{name}.lua").read_text()

    def inline(m: re.Match[str]) -> str:
        if m.group(1) == "defaults":
            return _defaults_lua()
        if m.group(1) == "layout":
            return layout.lua()
        # One segment per joinpath: an installed wheel gives a MultiplexedPath (rsched.lua has
        # no __init__.py), whose joinpath takes a single argument on Python 3.11.
        return str(base.joinpath("include").joinpath(f"{m.group(1)}.lua").read_text())

    source = layout.literals(_INCLUDE.sub(inline, text))
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, NoScriptError) or (
        isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT")
    )


Call = tuple[str, Sequence[str], Sequence[Any]]


class _Reload(NamedTuple):
    """What a NOSCRIPT reply (the script cache empties when Redis restarts) asks for, decided
    free of I/O for the sync and asyncio paths: load ``sources``, send the calls at ``redo``
    again, and `merge` their replies into the first ones."""

    sources: tuple[str, ...]
    redo: list[int]

    @classmethod
    def of(cls, calls: Sequence[Call], results: list[Any]) -> _Reload | None:
        if not any(map(_is_noscript, results)):
            return None
        redo = [i for i, res in enumerate(results) if _is_noscript(res)]
        return cls(tuple(load(name).source for name in {calls[i][0] for i in redo}), redo)

    def calls(self, calls: Sequence[Call]) -> list[Call]:
        return [calls[i] for i in self.redo]

    def merge(self, results: list[Any], again: list[Any]) -> list[Any]:
        for i, res in zip(self.redo, again, strict=False):
            results[i] = res
        return results


def _fill(p: Any, calls: Sequence[Call]) -> Any:
    for name, keys, args in calls:
        p.evalsha(load(name).sha, len(keys), *keys, *args)
    return p


def pipeline(r: Any, wait: Wait | None = None) -> Any:
    """A non-transactional pipeline; with ``wait``, its writes are confirmed by replicas
    (WAIT last in the pipeline, or in each master's part on a cluster; see rdb.durable)."""
    p = r.pipeline(transaction=False)
    if wait is not None and is_cluster(r):
        p.confirm_each = wait
    return p


def confirm_last(r: Any, p: Any, wait: Wait | None) -> Any:
    """End a pipeline of `pipeline` with WAIT (one Redis: the cluster pipeline does its own)."""
    if wait is not None and not is_cluster(r):
        p.execute_command(*wait.command())
    return p


def executed(r: Any, wait: Wait | None, replies: list[Any]) -> list[Any]:
    """A pipeline's replies, with its writes' confirmation applied (see `confirm_last`)."""
    return wait.confirm(replies) if wait is not None and not is_cluster(r) else replies


def _queued(r: Any, calls: Sequence[Call], wait: Wait | None) -> Any:
    return confirm_last(r, _fill(pipeline(r, wait), calls), wait)


def _send(r: Any, calls: Sequence[Call], direct: bool, wait: Wait | None = None) -> list[Any]:
    if direct:
        name, keys, args = calls[0]
        try:
            return [r.evalsha(load(name).sha, len(keys), *keys, *args)]
        except NoScriptError as e:
            return [e]
    p = _queued(r, calls, wait)
    return executed(r, wait, list(p.execute(raise_on_error=False)))


async def _asend(r: Any, calls: Sequence[Call], direct: bool,
                 wait: Wait | None = None) -> list[Any]:
    if direct:
        name, keys, args = calls[0]
        try:
            return [await r.evalsha(load(name).sha, len(keys), *keys, *args)]
        except NoScriptError as e:
            return [e]
    p = _queued(r, calls, wait)
    return executed(r, wait, list(await p.execute(raise_on_error=False)))


def _run(r: Any, calls: Sequence[Call], direct: bool = False,
         results: list[Any] | None = None, wait: Wait | None = None) -> list[Any]:
    """Send the calls (unless their ``results`` are in), reloading scripts if Redis lacks any."""
    results = _send(r, calls, direct, wait) if results is None else results
    if (reload := _Reload.of(calls, results)) is None:
        return results
    for source in reload.sources:
        r.script_load(source)
    return reload.merge(results, _send(r, reload.calls(calls), direct, wait))


async def _arun(r: Any, calls: Sequence[Call], direct: bool = False,
                wait: Wait | None = None) -> list[Any]:
    """_run on an asyncio client."""
    results = await _asend(r, calls, direct, wait)
    if (reload := _Reload.of(calls, results)) is None:
        return results
    for source in reload.sources:
        await r.script_load(source)
    return reload.merge(results, await _asend(r, reload.calls(calls), direct, wait))


def _raised(result: Any) -> Any:
    if isinstance(result, NoScriptError):
        raise result
    return result


def call(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run a script on a sync client."""
    return _raised(_run(r, [(name, keys, args)], direct=True)[0])


async def acall(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run a script on an asyncio client."""
    return _raised((await _arun(r, [(name, keys, args)], direct=True))[0])


def call_many(r: Any, calls: Iterable[Call], wait: Wait | None = None) -> list[Any]:
    """Run several scripts in one pipeline (one round trip); exceptions are returned in place.
    With ``wait``, replicas confirm the writes (see `pipeline`)."""
    todo = list(calls)
    return _run(r, todo, wait=wait) if todo else []


async def acall_many(r: Any, calls: Iterable[Call], wait: Wait | None = None) -> list[Any]:
    """call_many on an asyncio client."""
    todo = list(calls)
    return await _arun(r, todo, wait=wait) if todo else []


async def acall_many_then(r: Any, calls: Sequence[Call], more: Sequence[Sequence[Any]],
                          held: Held | None = None) -> tuple[list[Any], list[Any]]:
    """acall_many with more commands in the same round trip (one Redis with a connection pool,
    not a cluster), all written at once on one connection of the pool.  Returns the calls'
    results and the commands' replies apart, exceptions in place; the replies are raw (no
    redis-py response callback: an XREADGROUP reply is [[stream, [[id, [field, value, ...]],
    ...]], ...] under RESP2, {stream: [...]} under RESP3).  Not through redis-py's pipeline,
    whose command stack, callbacks and retry closures are the worker's largest cost per round
    trip (docs/performance.md: callgrind of loadtest/bench_phases.py).
    A connection error sends the calls again through acall_many's retrying pipeline (scripts are
    safe to apply twice) and the commands not at all (their replies: empty).  A call whose
    script Redis lacked is sent again after the load, alone: the commands are not repeated.
    ``held``: connections kept between round trips (see Held)."""
    cmds: list[Sequence[Any]] = [("EVALSHA", load(name).sha, len(keys), *keys, *args)
                                 for name, keys, args in calls]
    try:
        replies = await acommands_raw(r, [*cmds, *more], held)
    except (RedisConnectionError, RedisTimeoutError):
        return await acall_many(r, calls), []
    results, extra = replies[:len(calls)], replies[len(calls):]
    if (reload := _Reload.of(calls, results)) is not None:
        for source in reload.sources:
            await r.script_load(source)
        results = reload.merge(results, await _asend(r, reload.calls(calls), False))
    return results, extra


class Held:
    """Connections of one client's pool kept out of it between raw round trips (acommands_raw):
    redis-py 8's get_connection and release (a lock, observability records, a peek at the
    socket) are a quarter of a raw round trip's CPU (docs/performance.md).  A kept
    connection has every reply read (or is dropped), so it is as clean as the pool's check
    asks; at most ``keep`` are kept, the rest go back.  ``release`` gives them all back."""

    __slots__ = ("free", "keep", "pool")

    def __init__(self, keep: int) -> None:
        self.free: list[Any] = []
        self.keep = keep
        self.pool: Any = None  # whose connections these are (a client replaced: not kept)

    async def release(self) -> None:
        free, self.free = self.free, []
        for conn in free:
            await self.pool.release(conn)


async def acommands_raw(r: Any, cmds: Sequence[Sequence[Any]], held: Held | None = None
                        ) -> list[Any]:
    """Commands written at once on one connection of ``r``'s pool (or one ``held`` keeps), their
    replies raw (no redis-py response callback), error replies in place; a connection error is
    raised (the connection is dropped) and not retried: the caller decides."""
    pool = r.connection_pool
    if held is not None and held.pool is not pool:
        await held.release()
        held.pool = pool
    conn = held.free.pop() if held is not None and held.free else await pool.get_connection()
    try:
        await conn.send_packed_command(conn.pack_commands(cmds))
        replies: list[Any] = []
        for _ in cmds:
            try:
                replies.append(await conn.read_response())
            except ResponseError as e:
                replies.append(e)
    except BaseException:
        await conn.disconnect()  # replies may be unread: the next user must not get them
        await pool.release(conn)
        raise
    if held is not None and len(held.free) < held.keep:
        held.free.append(conn)
    else:
        await pool.release(conn)
    return replies


def pooled(r: Any) -> bool:
    """Whether ``r`` has one connection pool (one Redis): what acall_many_then needs."""
    return getattr(r, "connection_pool", None) is not None


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
    return _run(r, sent, results=results)

