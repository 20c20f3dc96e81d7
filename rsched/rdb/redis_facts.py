"""What `rsched doctor` and /readyz judge, read from Redis: each master's version, eviction
policy, persistence and replication settings, the stored partition count and, on a cluster,
its state and where the partitions live (rsched.service.doctor judges them)."""

from __future__ import annotations

from typing import Any

from rsched.core import defaults
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Masters, Op, cmd
from rsched.rdb.slots import SlotMap

_NODE_FACTS = (("info", ("server",)), ("config_get", ("maxmemory-policy",)),
               ("config_get", ("appendonly",)), ("config_get", ("appendfsync",)),
               ("info", ("replication",)), ("config_get", ("min-replicas-to-write",)),
               ("config_get", ("cluster-require-full-coverage",)),
               ("config_get", ("hash-max-listpack-value",)))


def _node_facts(res: list[Any]) -> dict[str, Any]:
    def conf(i: int, name: str) -> str | None:
        return None if isinstance(res[i], Exception) else as_text(res[i].get(name, "")) or None

    info = res[0] if isinstance(res[0], dict) else {}
    repl = res[4] if isinstance(res[4], dict) else {}
    return {
        "version": str(info.get("redis_version", "")) or None,
        "maxmemory-policy": conf(1, "maxmemory-policy"),
        "appendonly": conf(2, "appendonly"),
        "appendfsync": conf(3, "appendfsync"),
        "replicas": int(repl.get("connected_slaves", 0)),
        "min-replicas-to-write": int(conf(5, "min-replicas-to-write") or 0),
        "cluster-require-full-coverage": conf(6, "cluster-require-full-coverage"),
        "hash-max-listpack-value": int(conf(7, "hash-max-listpack-value") or 0) or None,
    }


def op_read_facts() -> Op[dict[str, Any]]:
    """What `doctor` and /readyz judge: version, eviction policy, AOF, fsync, partitions; on a
    cluster the same per master (``masters``), its state and where the partitions live."""
    masters = yield Masters()
    on = [{"target_node": i} if masters > 1 else {} for i in range(masters)]
    res = yield Commands([
        *(cmd(m, *a, **on[i]) for i in range(masters) for m, a in _NODE_FACTS),
        cmd("hget", keys.config(), "partitions"),
        *([cmd("execute_command", "CLUSTER INFO", **on[0]),
           cmd("execute_command", "CLUSTER SLOTS", **on[0])] if masters > 1 else []),
    ], raise_on_error=False)
    k = len(_NODE_FACTS)
    nodes = [_node_facts(res[i * k:(i + 1) * k]) for i in range(masters)]
    parts = res[masters * k]
    facts = {**nodes[0], "partitions": int(parts) if isinstance(parts, (bytes, str, int)) else None}
    if masters > 1:
        facts["cluster"] = _cluster_facts(res[-2], res[-1], nodes, facts["partitions"])
    return facts


def _cluster_facts(info: Any, slots_reply: Any, nodes: list[dict[str, Any]],
                   partitions: int | None) -> dict[str, Any]:
    """Per master (in slot order): its address, node facts and the partitions it holds."""
    if isinstance(info, dict):  # redis-py parses CLUSTER INFO into a dict
        state = info.get("cluster_state")
    else:
        text = "" if isinstance(info, Exception) else as_text(info)
        state = text.split("cluster_state:")[1].split()[0] if "cluster_state:" in text else None
    slots = SlotMap.parse(slots_reply) if isinstance(slots_reply, list) else SlotMap()
    n = partitions or defaults.PARTITIONS
    held: dict[Any, int] = dict.fromkeys(slots.masters, 0)
    for p in range(n):
        owner = slots.owner[keys.slot(keys.due(p))]
        if owner is not None:
            held[owner] += 1
    share = slots.slots_per_master()
    return {"state": state, "covered": sum(share.values()), "masters": [
        {"address": f"{a[0]}:{a[1]}", "slots": share[a], "partitions": held[a],
         "fair": -(-n * share[a] // keys.SLOTS), **node}
        for a, node in zip(slots.masters, nodes, strict=False)]}


__all__ = ["op_read_facts"]
