"""Redis Cluster routing, free of I/O: which key a command is routed by, which master serves
each slot (from CLUSTER SLOTS), and how a batch of commands splits into one pipeline per master
with each reply put back in place.  rdb.cluster sends them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsched.core.wire import as_text
from rsched.rdb.durable import Wait

Address = tuple[str, int]
# Where a node is reached, given the address the cluster advertises for it (NAT, containers).
Remap = Callable[[Address], Address]

# Commands without a key: sent to one master (the first in slot order).
_KEYLESS = frozenset({
    "TIME", "PING", "INFO", "CONFIG", "SCRIPT", "PUBLISH", "CLUSTER", "DBSIZE", "COMMAND",
    "CLIENT", "WAIT", "WAITAOF", "ROLE", "LATENCY", "SLOWLOG", "FUNCTION", "ECHO", "LASTSAVE",
    "SCAN",
})
_KEY_AFTER_SUBCOMMAND = frozenset({"XINFO", "XGROUP", "OBJECT", "MEMORY"})
# Errors after which the node's part of a batch is sent again (to the new owner, once known).
REROUTE = (AskError, ClusterDownError, TryAgainError, RedisConnectionError, RedisTimeoutError,
            ConnectionError, OSError)
TARGET_NODE = "target_node"  # command option: see SlotMap.node_for
ROUTE_BY = "route_by"  # command option: a key whose master a keyless command goes to
_ROUTING = (TARGET_NODE, ROUTE_BY)



def key_of(args: Sequence[Any]) -> Any:
    """The key a command is routed by, None for a keyless one."""
    name = as_text(args[0]).upper()
    if " " in name:  # redis-py folds a subcommand into the name ("XGROUP CREATE", key, ...)
        name = name.split(" ", 1)[0]
        return None if name in _KEYLESS else (args[1] if len(args) > 1 else None)
    if name in _KEYLESS:
        return None
    if name in ("EVALSHA", "EVAL", "FCALL", "EVALSHA_RO", "EVAL_RO"):
        return args[3] if int(args[2]) > 0 else None
    if name in ("XREADGROUP", "XREAD"):
        for i, a in enumerate(args):
            if as_text(a).upper() == "STREAMS":
                return args[i + 1]
        return None
    if name in _KEY_AFTER_SUBCOMMAND:
        return args[2] if len(args) > 2 else None
    return args[1] if len(args) > 1 else None


def endpoint(node: Sequence[Any], asked: str) -> str | None:
    """The host to reach a node at, from its CLUSTER SLOTS entry (host, port, id[, metadata]).

    As the CLUSTER SLOTS reference says and redis-py does: NULL (``cluster-preferred-endpoint-type
    unknown-endpoint``, nodes behind a load balancer) and "" (a node that does not know its own
    address yet) mean the host that answered, ``asked``.  "?" (hostnames preferred, none
    announced) names no reachable host: the node's IP from the metadata, else None (unknown)."""
    host = node[0]
    if host is None or host in (b"", ""):
        return asked or None
    text = as_text(host)
    if text != "?":
        return text
    meta = node[3] if len(node) > 3 else None
    if isinstance(meta, dict):
        ip = meta.get(b"ip", meta.get("ip"))
    elif isinstance(meta, (list, tuple)):  # RESP2: a flat list of names and values
        pairs = dict(zip(map(as_text, meta[::2]), meta[1::2], strict=False))
        ip = pairs.get("ip")
    else:
        ip = None
    return as_text(ip) if ip else None


def _address(node: Sequence[Any], asked: str, remap: Remap | None) -> Address | None:
    host = endpoint(node, asked)
    if host is None:
        return None
    addr = (host, int(node[1]))
    return remap(addr) if remap is not None else addr


@dataclass(slots=True)
class SlotMap:
    """Which master serves each of the 16384 slots, from CLUSTER SLOTS."""

    owner: list[Address | None] = field(default_factory=lambda: [None] * REDIS_CLUSTER_HASH_SLOTS)
    masters: list[Address] = field(default_factory=list)
    replicas: dict[Address, list[Address]] = field(default_factory=dict)

    @classmethod
    def parse(cls, reply: Sequence[Any], asked: str = "", remap: Remap | None = None) -> SlotMap:
        """The map in a CLUSTER SLOTS reply from the node at host ``asked``; ``remap`` turns
        each advertised address into the one to connect to.  A range whose master has no
        usable address is left uncovered (see `endpoint`)."""
        m = cls()
        for row in sorted(reply, key=lambda r: int(r[0])):
            lo, hi = int(row[0]), int(row[1])
            addr = _address(row[2], asked, remap)
            if addr is None:
                continue
            m.owner[lo:hi + 1] = [addr] * (hi - lo + 1)
            if addr not in m.replicas:
                m.masters.append(addr)
                m.replicas[addr] = []
            for rep in row[3:]:
                raddr = _address(rep, asked, remap)
                if raddr is not None and raddr not in m.replicas[addr]:
                    m.replicas[addr].append(raddr)
        return m

    def node_for(self, args: Sequence[Any], options: dict[str, Any] | None = None,
                 avoid: Collection[Address] = ()) -> Address:
        """The master for a command; option ``target_node`` (an index into `masters`, in slot
        order) sends a keyless command such as SCAN to one master, option ``route_by`` (a key)
        sends one such as TIME to that key's master.  Other keyless commands (TIME, PUBLISH)
        go to the first master not in ``avoid`` (recently unreachable)."""
        key = None
        if options:
            if TARGET_NODE in options:
                return self.masters[int(options[TARGET_NODE])]
            key = options.get(ROUTE_BY)
        if key is None:
            key = key_of(args)
        if key is None:
            return next((m for m in self.masters if m not in avoid), self.masters[0])
        addr = self.owner[key_slot(key if isinstance(key, bytes) else str(key).encode())]
        if addr is None:  # an uncovered slot: the node that had it is down, no failover yet
            raise ClusterDownError(f"no master serves the slot of key {as_text(key)!r}")
        return addr

    def slots_per_master(self) -> dict[Address, int]:
        counts = dict.fromkeys(self.masters, 0)
        for addr in self.owner:
            if addr is not None:
                counts[addr] += 1
        return counts


Cmd = tuple[tuple[Any, ...], dict[str, Any]]


def groups(slots: SlotMap, cmds: Sequence[Cmd], todo: Sequence[int], results: list[Any],
            avoid: Collection[Address]) -> dict[Address, list[int]]:
    """Indexes of ``todo`` per master; a command no master serves gets its error in place."""
    by_node: dict[Address, list[int]] = {}
    for i in todo:
        try:
            addr = slots.node_for(*cmds[i], avoid)
        except RedisError as e:
            results[i] = e
            continue
        if addr in avoid:  # unreachable a moment ago: fail at once rather than wait for it
            results[i] = RedisConnectionError(f"cluster node {addr[0]}:{addr[1]} is unreachable")
        else:
            by_node.setdefault(addr, []).append(i)
    return by_node


def sendable(options: dict[str, Any]) -> dict[str, Any]:
    """The options without the routing ones, which are not for redis-py."""
    if TARGET_NODE in options or ROUTE_BY in options:
        return {k: v for k, v in options.items() if k not in _ROUTING}
    return options


def node_pipeline(node: Any, cmds: Sequence[Cmd], idx: list[int], wait: Wait | None,
                  asking: bool = False) -> Any:
    """One node's part of a batch; ``asking``: each command preceded by ASKING (an ASK
    redirection: the node is importing the slot, and ASKING admits only the next command)."""
    pipe = node.pipeline(transaction=False)
    for i in idx:
        args, options = cmds[i]
        if asking:
            pipe.execute_command("ASKING")
        pipe.execute_command(*args, **sendable(options))
    if wait is not None:
        pipe.execute_command(*wait.command())
    return pipe


def confirmed(replies: list[Any], wait: Wait | None, asking: bool = False) -> list[Any]:
    """The commands' replies (ASKING's OKs dropped), each NotReplicated when WAIT fell short."""
    replies = list(replies)
    if asking:
        tail = replies[-1:] if wait is not None else []
        replies = replies[1:len(replies) - len(tail):2] + tail
    return wait.confirm(replies) if wait is not None else replies


def rerouted(results: list[Any], todo: Sequence[int]) -> list[int]:
    return [i for i in todo if isinstance(results[i], REROUTE)]


def is_ask(e: BaseException) -> TypeGuard[AskError]:
    """An ASK redirection (redis-py's MovedError subclasses AskError: MOVED means the slot map
    is stale, and is answered by refreshing it, not by ASKING)."""
    return isinstance(e, AskError) and not isinstance(e, MovedError)


def asked(results: list[Any], todo: Sequence[int]) -> dict[Address, list[int]]:
    """Indexes of ``todo`` answered with ASK, per node they were redirected to."""
    by_node: dict[Address, list[int]] = {}
    for i in todo:
        e = results[i]
        if is_ask(e):
            by_node.setdefault((e.host, e.port), []).append(i)
    return by_node
