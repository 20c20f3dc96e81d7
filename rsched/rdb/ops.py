"""The Op protocol: an operation is a generator that yields the Redis work it needs and gets
the results sent back, and two drivers execute it, one on redis-py and one on redis.asyncio.

Writing each operation once, free of I/O, keeps validation, script arguments and result
parsing in one place for the sync and async clients; the drivers here are the only code that
turns an operation's work into commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import AskError

from rsched.core.errors import ClusterNodeUrl
from rsched.rdb import scripts
from rsched.rdb.cluster import is_cluster
from rsched.rdb.durable import Wait, wait_of

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Scripts:
    """Run these script calls in one round trip; results (or exceptions) come back in order.
    The calls may be built lazily, while they are sent (see scripts.stream_many)."""

    calls: Iterable[scripts.Call]
    durable: bool = False  # a client-facing write: acknowledged once replicas have it


@dataclass(frozen=True, slots=True)
class Commands:
    """Run these commands, each ``(method, args, kwargs)`` of redis-py, in one pipeline."""

    cmds: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
    raise_on_error: bool = True
    durable: bool = False  # a client-facing write: acknowledged once replicas have it


def cmd(method: str, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """One command of a `Commands` step, spelled like the redis-py call."""
    return (method, args, kwargs)


@dataclass(frozen=True, slots=True)
class Blocking:
    """Call ``fn`` (an archive query, or CPU work that takes long, such as a backfill's
    occurrence times) and send back its value; the asyncio driver runs it in a thread so the
    event loop never waits on it."""

    fn: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Masters:
    """Send back how many masters hold the keyspace: 1 for one Redis; on a cluster, a
    keyless command such as SCAN goes to master ``i`` with the option ``target_node=i``."""


Work = Scripts | Commands | Blocking | Masters
Op = Generator[Work, Any, T]


def one(results: list[Any]) -> Any:
    """The only result of a one-call `Scripts`, raised if it is an error."""
    if isinstance(results[0], Exception):
        raise results[0]
    return results[0]


def fill_pipeline(pipe: Any, work: Commands) -> Any:
    """Queue a `Commands` step on a pipeline of either redis-py flavour."""
    for method, args, kwargs in work.cmds:
        getattr(pipe, method)(*args, **kwargs)
    return pipe


def streams(r: Any, durable: bool) -> bool:
    """Whether `execute` on the sync client ``r`` writes a Scripts step's calls to Redis as
    they are built (scripts.stream_many): one Redis, and no replicas to wait for on a durable
    step; otherwise they go in one pipeline once all are built."""
    return getattr(r, "connection_pool", None) is not None and not (
        durable and wait_of(r) is not None)


def _plain(r: Any, replies: Any) -> Any:
    """A plain client's replies with every MOVED or ASK reply (the URL reaches a Redis Cluster
    node) as ClusterNodeUrl: the raw reply reads ``6152 127.0.0.1:7612``."""
    if (isinstance(replies, list) and not is_cluster(r)
            and any(isinstance(x, AskError) for x in replies)):  # MovedError subclasses it
        return [ClusterNodeUrl() if isinstance(x, AskError) else x for x in replies]
    return replies


def execute(r: Any, work: Work) -> Any:
    """One step on a sync redis-py client, one pipeline (or script stream) per step."""
    try:
        return _plain(r, _execute(r, work))
    except AskError:
        if is_cluster(r):
            raise
        raise ClusterNodeUrl() from None


async def aexecute(r: Any, work: Work) -> Any:
    """One step on a redis.asyncio client; blocking archive reads go to a thread."""
    try:
        return _plain(r, await _aexecute(r, work))
    except AskError:
        if is_cluster(r):
            raise
        raise ClusterNodeUrl() from None


def _execute(r: Any, work: Work) -> Any:
    if isinstance(work, Blocking):
        return work.fn()
    if isinstance(work, Masters):
        if not is_cluster(r):
            return 1
        r.ready()
        return len(r.slots.masters)
    if isinstance(work, Scripts):
        if not streams(r, work.durable):
            return scripts.call_many(r, work.calls, wait_of(r) if work.durable else None)
        return scripts.stream_many(r, work.calls)
    wait = wait_of(r) if work.durable else None
    pipe = _commands(r, work, wait)
    return _raised(work, scripts.executed(r, wait, list(pipe.execute(raise_on_error=False))))


async def _aexecute(r: Any, work: Work) -> Any:
    if isinstance(work, Blocking):
        return await asyncio.to_thread(work.fn)
    if isinstance(work, Masters):
        if not is_cluster(r):
            return 1
        await r.ready()
        return len(r.slots.masters)
    if isinstance(work, Scripts):
        return await scripts.acall_many(r, work.calls, wait_of(r) if work.durable else None)
    wait = wait_of(r) if work.durable else None
    pipe = _commands(r, work, wait)
    return _raised(work, scripts.executed(r, wait, list(await pipe.execute(raise_on_error=False))))


def _commands(r: Any, work: Commands, wait: Wait | None) -> Any:
    """A pipeline holding the step's commands (and WAIT for a durable step)."""
    return scripts.confirm_last(r, fill_pipeline(scripts.pipeline(r, wait), work), wait)


def _raised(work: Commands, results: list[Any]) -> list[Any]:
    if work.raise_on_error:
        for res in results:
            if isinstance(res, Exception):
                raise res
    return results


def run(r: Any, op: Op[T]) -> T:
    """Drive an operation to its value on a sync client."""
    try:
        work = next(op)
        while True:
            work = op.send(execute(r, work))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(r: Any, op: Op[T]) -> T:
    """Drive an operation to its value on an asyncio client."""
    try:
        work = next(op)
        while True:
            work = op.send(await aexecute(r, work))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


__all__ = ["Blocking", "Commands", "Masters", "Op", "Scripts", "Work", "arun", "cmd",
           "fill_pipeline", "one", "run", "streams"]
