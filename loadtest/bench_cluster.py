"""`bench_engine.py --cluster`: the engine workload on one Redis and on a 3-master Redis Cluster.

Both on this machine, alternated `--rounds` times in one invocation (the machine's speed moves
more than most changes, so only figures from the same minutes compare).  The cluster has no
replicas for the CPU figures: each master's INFO CPU before/after the burst gives Redis CPU per
job summed over the masters, and jobs per CPU second of each master, what one master carries
at 100% of a core, the figure that scales with masters (on 2 cores a cluster cannot show more
throughput than one Redis).  Then the cost of the durability setting (WAIT for 1 replica) per
acknowledged write, on a 3-master + 3-replica cluster: `Client.schedule_many` with
wait_replicas 0 and 1, alternated.  Prints a table, then a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test fixtures' redis-server processes

from bench_engine import nodes_cpu_us, single, workload  # noqa: E402
from support.redis_probe import HOST  # noqa: E402
from support.redis_server import RedisCluster  # noqa: E402

from rsched import Client, JobSpec  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402

DURABILITY_BATCHES = (1, 1000)  # jobs per schedule_many call: one write, and a large batch


def name_of(port: int) -> str:
    return f"{HOST}:{port}"


def cluster(a: argparse.Namespace) -> dict[str, Any]:
    """The workload on a private 3-master cluster without replicas."""
    with RedisCluster(masters=3, replicas=0) as c:
        reader = c.client()
        nodes = {name_of(n.port): n.client() for n in c.masters()}
        result = workload(c.cluster_url, reader, nodes, a)
        placed: dict[str, int] = dict.fromkeys(nodes, 0)
        for p in range(a.partitions):
            node = reader.get_node_from_key(keys.stats(p))  # type: ignore[no-untyped-call]
            placed[name_of(int(node.port))] += 1
        result["partitions_per_master"] = placed
        return result


def schedule_timed(client: Client, n: int, batch: int) -> float:
    """Seconds to schedule n jobs (due in an hour: nothing runs them) in calls of `batch`."""
    run_at = client.now_ms() + 3_600_000
    specs = [JobSpec("noop", None, run_at=run_at) for _ in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        for res in client.schedule_many(specs[i : i + batch]):
            if isinstance(res, Exception):
                raise res
    return time.perf_counter() - t0


def durability(a: argparse.Namespace) -> dict[str, Any]:
    """us per call and per job, and Redis CPU per job, of schedule_many with WAIT 0 vs 1."""
    rounds = max(2, a.rounds)
    samples: dict[str, list[dict[str, float]]] = {}
    with RedisCluster(masters=3, replicas=1) as c:
        masters = {name_of(n.port): n.client() for n in c.masters()}
        replicas = {name_of(n.port): n.client() for n in c.replicas()}
        clients = {w: Client(settings=Settings.from_env(
            redis_url=c.cluster_url, partitions=a.partitions, wait_replicas=w)) for w in (0, 1)}
        for client in clients.values():
            schedule_timed(client, 100, 10)  # warm up: connections, scripts, slot map
        for _ in range(rounds):
            for w, client in clients.items():
                for batch in DURABILITY_BATCHES:
                    n = a.durability_jobs if batch > 1 else a.durability_jobs // 10
                    m0, r0 = nodes_cpu_us(masters), nodes_cpu_us(replicas)
                    secs = schedule_timed(client, n, batch)
                    m1, r1 = nodes_cpu_us(masters), nodes_cpu_us(replicas)
                    samples.setdefault(f"wait{w}_batch{batch}", []).append({
                        "us_per_call": secs * 1e6 / (n / batch),
                        "us_per_job": secs * 1e6 / n,
                        "master_cpu_us_per_job": (sum(m1.values()) - sum(m0.values())) / n,
                        "replica_cpu_us_per_job": (sum(r1.values()) - sum(r0.values())) / n,
                    })
    return {"rounds": rounds, "samples": samples}


def span(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def row(label: str, runs: dict[str, list[dict[str, Any]]], get: Callable[[dict[str, Any]], float],
        fmt: str = "{:,.0f}") -> str:
    cells = [span([get(r) for r in runs[mode]], fmt) for mode in ("single", "cluster")]
    return f"{label:44} {cells[0]:>18} {cells[1]:>22}"


def print_engine(runs: dict[str, list[dict[str, Any]]], a: argparse.Namespace) -> None:
    n = len(runs["single"])
    print(f"\nEngine, {a.jobs:,} jobs, {n} round(s) alternated (ranges over rounds)")
    print(f"{'':44} {'one Redis':>18} {'cluster, 3 masters':>22}")
    print(row("end to end, burst (jobs/s)", runs, lambda r: r["e2e_jobs_per_s"]))
    print(row("batch scheduling (jobs/s)", runs, lambda r: r["schedule_jobs_per_s"]))
    us = "{:.1f}"
    print(row("Redis CPU per job, all nodes (us)", runs, lambda r: r["redis_cpu_us_per_job"], us))
    print(row("dispatcher CPU per job (us)", runs, lambda r: r["dispatcher_cpu_us_per_job"], us))
    print(row("worker CPU per job (us)", runs, lambda r: r["worker_cpu_us_per_job"], us))
    print(row("start lag p99 at light load (ms)", runs, lambda r: r["lag_p99_ms"]))
    print(row("lost / duplicates (sum)", runs, lambda r: r["lost"] + r["duplicates"]))
    ratios = [c["redis_cpu_us_per_job"] / s["redis_cpu_us_per_job"]
              for s, c in zip(runs["single"], runs["cluster"], strict=True)]
    print(f"Redis CPU per job, cluster / one Redis, per round: "
          f"{', '.join(f'{x:.2f}x' for x in ratios)} (target at most 1.3x)")
    for i, (s, c) in enumerate(zip(runs["single"], runs["cluster"], strict=True), 1):
        (one,) = s["node_jobs_per_cpu_s"].values()
        per = [f"{c['partitions_per_master'][m]} partitions {c['node_cpu_us_per_job'][m]:.1f} us "
               f"{c['node_jobs_per_cpu_s'][m]:,} jobs/s" for m in sorted(c["node_jobs_per_cpu_s"])]
        print(f"round {i}: jobs/s at 100% of a core: one Redis {one:,}; masters: {'; '.join(per)}")


def print_durability(d: dict[str, Any]) -> None:
    print(f"\nDurability (3 masters + 3 replicas, schedule_many, {d['rounds']} rounds alternated; "
          "median, range)")
    s = d["samples"]
    for batch in DURABILITY_BATCHES:
        for w in (0, 1):
            got = s[f"wait{w}_batch{batch}"]
            cells = []
            for field in ("us_per_call", "us_per_job", "master_cpu_us_per_job",
                          "replica_cpu_us_per_job"):
                vals = [g[field] for g in got]
                cells.append(f"{field} {statistics.median(vals):,.1f} ({span(vals, '{:,.1f}')})")
            print(f"batch {batch:>5}, WAIT {w}: " + ", ".join(cells))
        extra = [statistics.median(g[f] for g in s[f"wait1_batch{batch}"])
                 - statistics.median(g[f] for g in s[f"wait0_batch{batch}"])
                 for f in ("us_per_call", "us_per_job", "master_cpu_us_per_job",
                           "replica_cpu_us_per_job")]
        print(f"batch {batch:>5}, WAIT 1 - WAIT 0 (medians): {extra[0]:,.1f} us per call, "
              f"{extra[1]:,.2f} us per job, Redis CPU {extra[2]:+.2f} us per job on masters, "
              f"{extra[3]:+.2f} on replicas")


def run_cluster_bench(a: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, Any]]] = {"single": [], "cluster": []}
    for i in range(a.rounds):
        for mode, run in (("single", single), ("cluster", cluster)):
            print(f"round {i + 1}/{a.rounds}: {mode} ...", file=sys.stderr, flush=True)
            runs[mode].append(run(a))
            print(json.dumps({"mode": mode, **runs[mode][-1]}), file=sys.stderr, flush=True)
    print("durability ...", file=sys.stderr, flush=True)
    d = durability(a)
    print_engine(runs, a)
    print_durability(d)
    print(json.dumps({**runs, "durability": d}))

