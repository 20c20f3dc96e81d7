"""Redis health: what `rsched doctor` and /readyz judge, and the judgement (each finding that is
not ok says what to change)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsched.core import defaults
from rsched.rdb import keys
from rsched.rdb.ops import Op
from rsched.rdb.redis_facts import op_read_facts
from rsched.rdb.setup import SAFE_POLICIES, replicas_short


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    level: str  # ok | warn | fail
    message: str


def op_redis_facts() -> Op[dict[str, Any]]:
    """What `rsched doctor` and /readyz judge (rdb.redis_facts)."""
    return (yield from op_read_facts())


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def judge(facts: dict[str, Any], wanted_partitions: int = 0,
           wanted_replicas: int = 0) -> list[Finding]:
    """Judge the facts; every finding that is not ok says what to change.  ``wanted_replicas``:
    the replicas each client-facing write waits for (RSCHED_WAIT_REPLICAS, resolved)."""
    out: list[Finding] = []
    v = facts.get("version")
    if v is None:
        out.append(Finding("version", "warn", "cannot read the Redis version (INFO disabled?)"))
    elif _version(v) < (6, 2):
        out.append(Finding("version", "fail", f"Redis {v} lacks XAUTOCLAIM: upgrade to 6.2+"))
    else:
        out.append(Finding("version", "ok", f"Redis {v}"))
    pol = facts.get("maxmemory-policy")
    if pol is None:
        out.append(Finding("maxmemory-policy", "warn",
                           "cannot read it (CONFIG disabled?): make sure it is noeviction"))
    elif pol not in SAFE_POLICIES:
        out.append(Finding("maxmemory-policy", "fail", f"{pol} lets Redis evict jobs: "
                           "CONFIG SET maxmemory-policy noeviction (and in redis.conf)"))
    else:
        out.append(Finding("maxmemory-policy", "ok", pol))
    aof, fsync = facts.get("appendonly"), facts.get("appendfsync")
    if aof != "yes":
        out.append(Finding("appendonly", "warn", f"AOF is {aof or 'unknown'}: a Redis crash loses "
                           "recent jobs; set appendonly yes"))
    else:
        out.append(Finding("appendonly", "ok", "yes"))
    if fsync not in ("everysec", "always"):
        out.append(Finding("appendfsync", "warn", f"appendfsync is {fsync or 'unknown'}: set "
                           "appendfsync everysec (loses at most a second of writes)"))
    else:
        out.append(Finding("appendfsync", "ok", fsync))
    lp, want = facts.get("hash-max-listpack-value"), defaults.HASH_LISTPACK_VALUE
    if lp is None:
        out.append(Finding("hash-max-listpack-value", "warn", "cannot read it (CONFIG "
                           f"disabled?): make sure it is {want} or more"))
    elif lp < want:
        out.append(Finding("hash-max-listpack-value", "warn", f"{lp}: a job whose packed spec "
                           f"is longer takes about twice the memory (1,159 B against 545 B for "
                           f"a small payload); set hash-max-listpack-value {want}"))
    else:
        out.append(Finding("hash-max-listpack-value", "ok", str(lp)))
    stored = facts.get("partitions")
    if stored is None:
        out.append(Finding("partitions", "warn", "not set yet: the first rsched process stores "
                           f"{wanted_partitions or defaults.PARTITIONS} (RSCHED_PARTITIONS)"))
    elif wanted_partitions and stored != wanted_partitions:
        out.append(Finding("partitions", "fail", f"Redis holds {stored} partitions, this "
                           f"process wants {wanted_partitions}: set RSCHED_PARTITIONS={stored}"))
    else:
        out.append(Finding("partitions", "ok", str(stored)))
    if (cluster := facts.get("cluster")) is not None:
        out += _cluster_findings(cluster, wanted_partitions, wanted_replicas)
    elif wanted_replicas:
        out.append(_replicas_finding("replicas", facts["replicas"], wanted_replicas))
    return out


def _replicas_finding(check: str, replicas: int, wanted: int) -> Finding:
    """A master's replicas against what writes wait for: fewer is an error (each write would be
    applied, then reported as failed); none at all, with writes not waiting, a warning."""
    if replicas < wanted:
        return Finding(check, "fail", replicas_short(wanted, {"": replicas}) or "")
    if replicas < 1:
        return Finding(check, "warn", "no replica: a failover has nowhere to go; add one")
    return Finding(check, "ok", str(replicas))


def _cluster_findings(cluster: dict[str, Any], wanted_partitions: int,
                      wanted_replicas: int) -> list[Finding]:
    """Cluster state, slot coverage, and per master: the node checks, replicas, min-replicas
    settings and its share of the partitions."""
    out = [Finding("cluster_state", "ok" if cluster["state"] == "ok" else "fail",
                   str(cluster["state"])),
           Finding("slots", "ok" if cluster["covered"] == keys.SLOTS else "fail",
                   f"{cluster['covered']} of {keys.SLOTS} slots served"
                   + ("" if cluster["covered"] == keys.SLOTS else
                      ": assign every slot (redis-cli --cluster fix)"))]
    for m in cluster["masters"]:
        name = m["address"]
        out += [Finding(f"{name} {f.check}", f.level, f.message)
                for f in judge({**m, "partitions": 0}, 0)[:5]]
        out.append(_replicas_finding(f"{name} replicas", m["replicas"], wanted_replicas))
        if m["min-replicas-to-write"] < 1:
            out.append(Finding(f"{name} min-replicas-to-write", "warn", "0: a master cut off "
                               "from its replica keeps taking writes a failover will drop; "
                               "set min-replicas-to-write 1, min-replicas-max-lag 10"))
        if m["cluster-require-full-coverage"] == "yes":
            out.append(Finding(f"{name} cluster-require-full-coverage", "warn",
                               "yes: while one master is down every master refuses all "
                               "commands; set cluster-require-full-coverage no"))
        level = "warn" if m["partitions"] > m["fair"] + 1 else "ok"
        out.append(Finding(f"{name} partitions", level,
                           f"{m['partitions']} on {m['slots']} slots (its share: {m['fair']})"))
    return out
