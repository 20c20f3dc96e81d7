"""Redis Cluster routing: one client object that sends each command to the master owning its
key's slot, and splits every pipeline into one pipeline per master, sent concurrently.

Why not redis-py's cluster client (docs/design/cluster-router.md, checked against redis-py
8.2): a durable write ends each master's part with WAIT on the connection that wrote it and is
judged by that master's reply, where the stock pipeline sends WAIT to one node or sums every
master's replies into one; and a master that does not answer fails only the commands sent to
it, at once, where the stock pipeline fails the whole batch or holds it while it retries that
master's commands one by one.  Each master is served by a plain client (the same options and
packing as a single Redis, but no retries of its own), so what is built for one Redis works
per node.  Node addresses come from CLUSTER SLOTS (an endpoint a node cannot name: see
slots.endpoint), through an optional remap (NAT, containers).

Routing is by the first key of each command (`key_of`); rsched never sends a command whose keys
span slots (a partition's keys share one hash tag).  Keyless commands go to one master
(`TIME`, `PUBLISH`, which a cluster broadcasts, `CONFIG`, `INFO`); `SCRIPT LOAD` goes to all.
A MOVED reply, or a node that cannot be reached, refreshes the slot map (CLUSTER SLOTS from any
node that answers) and sends that node's part again once: every rsched script and pipelined
command is safe to apply twice.  An ASK reply (the key's slot is being migrated and the key is
already on the target) is followed once: ASKING and the command go to the node it names, in
one pipeline per target node, without changing the slot map (the slot is still the source's
until the migration ends, when a MOVED refreshes it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.commands.core import AsyncCoreCommands, CoreCommands
from redis.crc import key_slot
from redis.exceptions import AskError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsched.rdb.durable import Wait
from rsched.rdb.slots import (
    REROUTE,
    Address,
    Cmd,
    Remap,
    SlotMap,
    asked,
    confirmed,
    groups,
    is_ask,
    node_pipeline,
    rerouted,
    sendable,
)

REFRESH_MIN_INTERVAL_S = 0.1  # a storm of errors refreshes the slot map at most this often
# A node that could not be reached is not sent anything for this long (its commands fail at
# once, keyless ones go elsewhere): waiting for it would hold up every batch that also went to
# healthy masters.  Meanwhile the slot map is refreshed, and a failover moves its slots away.
DOWN_FOR_S = 1.0


class _Recorder(CoreCommands):
    """A pipeline's command methods: each records (args, options) and returns the pipeline."""

    _event_dispatcher: Any = None  # redis-py's command mixins declare it; nothing here emits

    def __init__(self) -> None:
        self.stack: list[Cmd] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.stack.append((args, options))
        return self

    def __len__(self) -> int:
        return len(self.stack)


class _Nodes:
    """What the sync and asyncio clients share: the slot map, one plain client per node (made
    on first use), and when and where to ask for a new slot map."""

    is_cluster = True
    _event_dispatcher: Any = None  # redis-py's command mixins declare it; nothing here emits

    def __init__(self, seeds: Sequence[Address], node_factory: Callable[[str, int], Any],
                 slots: SlotMap | None = None, remap: Remap | None = None) -> None:
        self._seeds = list(seeds)
        self._factory = node_factory
        self._remap = remap
        self._nodes: dict[Address, Any] = {}
        self._lock = threading.Lock()
        self._refreshed = 0.0
        self._down: dict[Address, float] = {}
        self._pubsubs = -1
        self.slots = slots or SlotMap()

    def node(self, addr: Address) -> Any:
        """The plain client of one node."""
        with self._lock:
            client = self._nodes.get(addr)
            if client is None:
                client = self._nodes[addr] = self._factory(*addr)
            return client

    def masters(self) -> list[Any]:
        return [self.node(a) for a in self.slots.masters]

    def _refresh_from(self, force: bool) -> list[Address]:
        """Nodes to ask for the slot map, in order (known masters, replicas, then seeds);
        none when the last refresh was too recent."""
        if not force and time.monotonic() - self._refreshed < REFRESH_MIN_INTERVAL_S:
            return []
        self._refreshed = time.monotonic()
        known = [*self.slots.masters, *(r for rs in self.slots.replicas.values() for r in rs)]
        return list(dict.fromkeys([*known, *self._seeds]))

    def _avoid(self) -> set[Address]:
        now = time.monotonic()
        return {a for a, until in self._down.items() if until > now}

    def _failed(self, addr: Address, e: BaseException) -> None:
        """Mark a node unreachable for DOWN_FOR_S after a connection error."""
        if isinstance(e, (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)):
            self._down[addr] = time.monotonic() + DOWN_FOR_S

    def _pubsub_node(self) -> Address:
        """Each new subscription (the first, or one after its connection failed) goes to the
        next master in turn, so a listener on a dead master moves on (a seed before the first
        slot map)."""
        nodes = self.slots.masters or self._seeds
        self._pubsubs += 1
        return nodes[self._pubsubs % len(nodes)]

    def _slot_map(self, reply: Sequence[Any], asked: Address) -> SlotMap:
        return SlotMap.parse(reply, asked[0], self._remap)

    def _redirect(self, e: AskError, sent_to: Address | None) -> Address:
        """Where an ASK reply sends a command: an empty host is the host of the node that
        answered (as in CLUSTER SLOTS), then the address is remapped like the slot map's."""
        addr = (e.host or (sent_to[0] if sent_to else ""), int(e.port))
        return self._remap(addr) if self._remap is not None else addr

    def _ask_targets(self, ask: dict[Address, list[int]], cmds: Sequence[Cmd],
                     results: list[Any]) -> dict[Address, list[int]]:
        """``ask`` (indexes per advertised address) per address to connect to."""
        if self._remap is None and all(host for host, _ in ask):
            return ask
        by_node: dict[Address, list[int]] = {}
        for idx in ask.values():
            for i in idx:
                e = results[i]
                try:  # no host: the node that answered, the command's master by this slot map
                    sent_to = None if e.host else self.slots.node_for(*cmds[i])
                except RedisError:
                    continue  # another thread's refresh uncovered the slot: resent after one
                by_node.setdefault(self._redirect(e, sent_to), []).append(i)
        return by_node

    def _take_nodes(self) -> list[Any]:
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        return nodes


def _no_answer(error: Exception | None) -> RedisConnectionError:
    return RedisConnectionError(f"no node of the cluster answered CLUSTER SLOTS: {error}")


# --- sync ----------------------------------------------------------------------------------


class ClusterRedis(_Nodes, CoreCommands):
    """A sync client for a Redis Cluster, used where rsched uses a redis.Redis."""

    def __init__(self, seeds: Sequence[Address], node_factory: Callable[[str, int], Any],
                 slots: SlotMap | None = None, remap: Remap | None = None) -> None:
        super().__init__(seeds, node_factory, slots, remap)
        self._pool: ThreadPoolExecutor | None = None

    def ready(self) -> None:
        """Read the slot map at first use: a process started before the cluster waits for it
        in its own start-up loop instead of failing when it builds its client."""
        if not self.slots.masters:
            self.refresh(force=True)

    def derived(self, wrap: Callable[[Any], Any]) -> ClusterRedis:
        """A client on the same nodes and connections whose node clients are ``wrap(node)``."""
        return ClusterRedis(self._seeds, lambda h, p: wrap(self.node((h, p))), self.slots,
                            self._remap)

    def refresh(self, force: bool = False) -> None:
        """Read the slot map from the first node that answers."""
        error: Exception | None = None
        for addr in (todo := self._refresh_from(force)):
            try:
                self.slots = self._slot_map(self.node(addr).execute_command("CLUSTER SLOTS"),
                                            addr)
                return
            except (RedisError, OSError) as e:
                error = e
        if todo:
            raise _no_answer(error)

    # -- commands --

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.ready()
        for attempt in range(2):
            addr: Address | None = None  # none yet when no master serves the key's slot
            try:
                addr = self.slots.node_for(args, options, self._avoid())
                return self.node(addr).execute_command(*args, **sendable(options))
            except REROUTE as e:
                if is_ask(e):
                    pipe = node_pipeline(self.node(self._redirect(e, addr)), [(args, options)],
                                         [0], None, asking=True)
                    return confirmed(pipe.execute(), None, asking=True)[0]
                if addr is not None:
                    self._failed(addr, e)
                if attempt:
                    raise
                self._after_error(e)
        raise AssertionError("unreachable")

    def _after_error(self, e: BaseException) -> None:
        try:
            self.refresh(force=isinstance(e, AskError))
        except RedisError:
            pass  # the next call fails on its own

    def script_load(self, script: Any) -> Any:
        """SCRIPT LOAD on every master (a NOSCRIPT may come from any of them)."""
        self.ready()
        sha = None
        for client in self.masters():
            sha = client.script_load(script)
        return sha

    def pipeline(self, transaction: bool = False, shard_hint: Any = None) -> ClusterPipeline:
        if transaction:
            raise ValueError("rsched never sends MULTI on a cluster (keys span slots)")
        return ClusterPipeline(self)

    def pubsub(self, **kwargs: Any) -> Any:
        """Pub/sub on one master: a cluster delivers PUBLISH on every node."""
        return self.node(self._pubsub_node()).pubsub(**kwargs)

    def run_batch(self, cmds: Sequence[Cmd], wait: Wait | None = None) -> list[Any]:
        """Every command's reply or error, in order: one pipeline per master, concurrently;
        with ``wait``, each master's part ends in WAIT (see rdb.durable).  ASK replies are
        followed once; other redirections and node failures are sent again once, after the
        slot map is refreshed."""
        self.ready()
        results: list[Any] = [None] * len(cmds)
        todo: Sequence[int] = range(len(cmds))
        for attempt in range(2):
            self._send(groups(self.slots, cmds, todo, results, self._avoid()), cmds, results,
                       wait)
            todo = rerouted(results, todo)
            if ask := asked(results, todo):
                self._send(self._ask_targets(ask, cmds, results), cmds, results, wait,
                           asking=True)
                todo = rerouted(results, todo)
            if not todo or attempt:
                break
            self._after_error(results[todo[0]])
        return results

    def _send(self, by_node: dict[Address, list[int]], cmds: Sequence[Cmd], results: list[Any],
              wait: Wait | None, asking: bool = False) -> None:
        """Each node's part as one pipeline, the parts concurrently."""
        if len(by_node) == 1:
            ((addr, idx),) = by_node.items()
            self._run_node(addr, cmds, idx, results, wait, asking)
        elif by_node:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rsched-rc")
            list(self._pool.map(
                lambda kv: self._run_node(kv[0], cmds, kv[1], results, wait, asking),
                by_node.items()))

    def _run_node(self, addr: Address, cmds: Sequence[Cmd], idx: list[int],
                  results: list[Any], wait: Wait | None, asking: bool = False) -> None:
        try:
            pipe = node_pipeline(self.node(addr), cmds, idx, wait, asking)
            replies = confirmed(pipe.execute(raise_on_error=False), wait, asking)
        except Exception as e:  # noqa: BLE001 - the node failed: each of its commands gets it
            self._failed(addr, e)
            replies = [e] * len(idx)
        for i, res in zip(idx, replies, strict=True):
            results[i] = res

    def close(self) -> None:
        for client in self._take_nodes():
            client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def __enter__(self) -> ClusterRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClusterPipeline(_Recorder):
    """A non-transactional pipeline over a cluster (see ClusterRedis.run_batch)."""

    def __init__(self, client: ClusterRedis) -> None:
        super().__init__()
        self.client = client
        self.confirm_each: Wait | None = None  # see rdb.durable

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        cmds, self.stack = self.stack, []
        results = self.client.run_batch(cmds, self.confirm_each)
        if raise_on_error:
            for res in results:
                if isinstance(res, Exception):
                    raise res
        return results

    def __enter__(self) -> ClusterPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack = []


# --- asyncio -------------------------------------------------------------------------------


class AsyncClusterRedis(_Nodes, AsyncCoreCommands):  # type: ignore[misc]  # redis-py stubs
    """The asyncio twin of ClusterRedis: node clients are redis.asyncio clients and each
    master's part of a batch is one task.  The slot map is read at first use."""

    async def refresh(self, force: bool = False) -> None:
        error: Exception | None = None
        for addr in (todo := self._refresh_from(force)):
            try:
                reply = await self.node(addr).execute_command("CLUSTER SLOTS")
                self.slots = self._slot_map(reply, addr)
                return
            except (RedisError, OSError) as e:
                error = e
        if todo:
            raise _no_answer(error)

    async def ready(self) -> None:
        if not self.slots.masters:
            await self.refresh(force=True)

    async def _after_error(self, e: BaseException) -> None:
        try:
            await self.refresh(force=isinstance(e, AskError))
        except RedisError:
            pass

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        await self.ready()
        for attempt in range(2):
            addr: Address | None = None  # none yet when no master serves the key's slot
            try:
                addr = self.slots.node_for(args, options, self._avoid())
                return await self.node(addr).execute_command(*args, **sendable(options))
            except REROUTE as e:
                if is_ask(e):
                    pipe = node_pipeline(self.node(self._redirect(e, addr)), [(args, options)],
                                         [0], None, asking=True)
                    return confirmed(await pipe.execute(), None, asking=True)[0]
                if addr is not None:
                    self._failed(addr, e)
                if attempt:
                    raise
                await self._after_error(e)
        raise AssertionError("unreachable")

    async def script_load(self, script: Any) -> Any:  # type: ignore[override]
        await self.ready()
        sha = None
        for client in self.masters():
            sha = await client.script_load(script)
        return sha

    def pipeline(self, transaction: bool = False, shard_hint: Any = None) -> AsyncClusterPipeline:
        if transaction:
            raise ValueError("rsched never sends MULTI on a cluster (keys span slots)")
        return AsyncClusterPipeline(self)

    def pubsub(self, **kwargs: Any) -> Any:
        """Pub/sub on one master: a cluster delivers PUBLISH on every node."""
        return self.node(self._pubsub_node()).pubsub(**kwargs)

    async def run_batch(self, cmds: Sequence[Cmd], wait: Wait | None = None) -> list[Any]:
        await self.ready()
        results: list[Any] = [None] * len(cmds)
        todo: Sequence[int] = range(len(cmds))
        for attempt in range(2):
            await self._send(groups(self.slots, cmds, todo, results, self._avoid()), cmds,
                             results, wait)
            todo = rerouted(results, todo)
            if ask := asked(results, todo):
                await self._send(self._ask_targets(ask, cmds, results), cmds, results, wait,
                                 asking=True)
                todo = rerouted(results, todo)
            if not todo or attempt:
                break
            await self._after_error(results[todo[0]])
        return results

    async def _send(self, by_node: dict[Address, list[int]], cmds: Sequence[Cmd],
                    results: list[Any], wait: Wait | None, asking: bool = False) -> None:
        await asyncio.gather(*(self._run_node(a, cmds, idx, results, wait, asking)
                               for a, idx in by_node.items()))

    async def _run_node(self, addr: Address, cmds: Sequence[Cmd], idx: list[int],
                        results: list[Any], wait: Wait | None, asking: bool = False) -> None:
        try:
            pipe = node_pipeline(self.node(addr), cmds, idx, wait, asking)
            replies = confirmed(await pipe.execute(raise_on_error=False), wait, asking)
        except Exception as e:  # noqa: BLE001 - the node failed: each of its commands gets it
            self._failed(addr, e)
            replies = [e] * len(idx)
        for i, res in zip(idx, replies, strict=True):
            results[i] = res

    async def aclose(self) -> None:
        for client in self._take_nodes():
            await client.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncClusterRedis:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncClusterPipeline(_Recorder):
    def __init__(self, client: AsyncClusterRedis) -> None:
        super().__init__()
        self.client = client
        self.confirm_each: Wait | None = None  # see rdb.durable

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        cmds, self.stack = self.stack, []
        results = await self.client.run_batch(cmds, self.confirm_each)
        if raise_on_error:
            for res in results:
                if isinstance(res, Exception):
                    raise res
        return results

    async def __aenter__(self) -> AsyncClusterPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stack = []


def is_cluster(r: Any) -> bool:
    return bool(getattr(r, "is_cluster", False))


def same_slot_groups(r: Any, names: Iterable[str]) -> list[list[str]] | list[None]:
    """Keys that one multi-key command may take together: all of them on one Redis ([None]:
    no split), one group per slot on a cluster."""
    if not is_cluster(r):
        return [None]
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(key_slot(name.encode()), []).append(name)
    return list(groups.values())


def with_raw_replies(r: Any, command: str) -> Any:
    """A sync client on the same connections whose ``command`` replies skip redis-py's
    response callback (a raw-reply fast path: the archiver's XREADGROUP)."""
    def raw(client: Any) -> Any:
        c = type(client)(connection_pool=client.connection_pool)
        c.set_response_callback(command, lambda response, **_: response)
        return c

    return r.derived(raw) if is_cluster(r) else raw(r)


def clock_routes(r: Any, names: Sequence[str]) -> tuple[list[str | None], list[int]]:
    """Where to send TIME so that each of ``names`` is judged by its own node's clock: the keys
    to route one TIME each by (``route_by``; [None], one plain TIME, on one Redis) and, per
    name, the index of its TIME.  On a cluster: one TIME per master by the current slot map
    (one per name while the map is unknown or a slot is uncovered)."""
    if not is_cluster(r):
        return [None], [0] * len(names)
    owner = r.slots.owner
    routes: list[str | None] = []
    first: dict[Any, int] = {}
    index: list[int] = []
    for name in names:
        node = owner[key_slot(name.encode())] if r.slots.masters else None
        i = first.get(node) if node is not None else None
        if i is None:
            i = len(routes)
            routes.append(name)
            if node is not None:
                first[node] = i
        index.append(i)
    return routes, index
