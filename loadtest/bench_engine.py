"""Engine benchmark (no HTTP): schedule N jobs due at one instant, run them with no-op handlers.

One dispatcher and one worker process against a private redis-server (with --cluster also
against a private 3-master Redis Cluster, alternated: loadtest/bench_cluster.py).  Phase 1
(burst): N jobs (default 100,000) due at one instant a few seconds ahead; measures batch
scheduling and end-to-end throughput.  Phase 2 (light): 1,000 jobs/s spread evenly for a few
seconds; measures start lag (started - scheduled, both by Redis's clock), while cpu_probe.py
measures how much the machine itself stalls meanwhile.  Prints a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rsched import Client, JobSpec  # noqa: E402
from rsched.archive.events import expand  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(tmp: str, aof: bool) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
            "--save", "", "--appendonly", "yes" if aof else "no", "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def nodes_cpu_us(nodes: dict[str, redis.Redis]) -> dict[str, float]:
    """Each Redis node's CPU so far (INFO CPU), by name."""
    return {name: cpu_us(r) for name, r in nodes.items()}


def proc_cpu_us(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc), in microseconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e6 / os.sysconf("SC_CLK_TCK")


def succeeded(r: Any, partitions: int) -> int:
    p = r.pipeline(transaction=False)
    for i in range(partitions):
        p.hget(keys.stats(i), "succeeded")
    return sum(int(v or 0) for v in p.execute())


def event_entries(r: Any, partitions: int) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
    """Every entry of every partition's events stream so far, in stream order, read in pages."""
    for i in range(partitions):
        last = "-"
        while True:
            batch = r.xrange(keys.events(i), min=last, count=10_000)
            if last != "-" and batch:
                batch = batch[1:]
            if not batch:
                break
            yield from batch
            last = batch[-1][0].decode()


def started_events(r: Any, partitions: int) -> list[tuple[str, int, int]]:
    """(run id, sched ms, started ms) of every start, read from the events streams: 'started'
    events, and outcome events that carry their run's start ('st', lua/complete.lua)."""
    out = []
    for eid, entry in event_entries(r, partitions):
        for _sid, f in expand(eid, entry):  # a script call's events share an entry
            started = f[b"t"] if f[b"e"] == b"started" else f.get(b"st")
            if started is not None:
                rid = f[b"r"].decode()  # <job id>@<scheduled ms>
                out.append((rid, int(rid.rpartition("@")[2]), int(started)))
    return out


def dispatch_times(r: Any, partitions: int) -> list[int]:
    """The Redis time of every 'dispatched' event so far (one per run), from the events
    streams: when the dispatcher handed each run to its queue."""
    out: list[int] = []
    for _eid, f in event_entries(r, partitions):
        if f.get(b"e") == b"dispatched":
            out += [int(f[b"t"])] * int(f.get(b"n", b"1"))
    return out


def pct(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def wait_for(r: Any, partitions: int, target: int, timeout: float) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if succeeded(r, partitions) >= target:
            return time.time()
        time.sleep(0.02)
    raise TimeoutError(f"only {succeeded(r, partitions)} of {target} jobs succeeded")


def start_engine(url: str, a: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    """One dispatcher and one worker process on `url` (acknowledged on the primary's word: the
    CPU runs have no replicas; the durability cost is measured apart, bench_cluster.py)."""
    # RSCHED_EVENTS_KEEP(_MS) 0: the start lag, lost and duplicates are read from every event.
    env = dict(os.environ, RSCHED_REDIS_URL=url, RSCHED_PARTITIONS=str(a.partitions),
               PYTHONPATH=str(ROOT), RSCHED_ALLOW_UNSAFE_REDIS="1", RSCHED_WAIT_REPLICAS="0",
               RSCHED_EVENTS_KEEP="0", RSCHED_EVENTS_KEEP_MS="0")
    cli = [sys.executable, "-m", "rsched.cli", "--log-level", "WARNING"]
    return [subprocess.Popen(cli + ["dispatcher"], env=env, cwd=str(ROOT)),
            subprocess.Popen(cli + ["worker", "--app", "loadtest.noop_app:app", "--concurrency",
                                    str(a.concurrency)], env=env, cwd=str(ROOT))]


def stop_engine(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def burst(client: Client, reader: Any, nodes: dict[str, redis.Redis],
          procs: list[subprocess.Popen[bytes]], a: argparse.Namespace) -> dict[str, Any]:
    """Phase 1: N jobs due at one instant; scheduling rate, end-to-end rate, CPU per job."""
    # Far enough ahead that scheduling (a few thousand jobs/s here) ends before it is due.
    due_at = client.now_ms() + 3000 + a.jobs // 4
    specs = [JobSpec("noop", None, run_at=due_at) for _ in range(a.jobs)]
    t0 = time.perf_counter()
    for i in range(0, a.jobs, 5000):
        for res in client.schedule_many(specs[i : i + 5000]):
            if isinstance(res, Exception):
                raise res
    sched_s = time.perf_counter() - t0
    # CPU per job of running them (the burst), not of scheduling them: each schedule call
    # also wakes the dispatcher for a claim round, a varying share of Redis's time.
    cpu0 = nodes_cpu_us(nodes)
    dcpu0, wcpu0 = proc_cpu_us(procs[0].pid), proc_cpu_us(procs[1].pid)
    wait_s = (due_at - client.now_ms()) / 1000
    if wait_s < 0:
        print(f"warning: scheduling overran the due time by {-wait_s:.1f} s", file=sys.stderr)
    done_at = wait_for(reader, a.partitions, a.jobs, 300)
    cpu = {name: us - cpu0[name] for name, us in nodes_cpu_us(nodes).items()}
    dcpu = proc_cpu_us(procs[0].pid) - dcpu0
    wcpu = proc_cpu_us(procs[1].pid) - wcpu0
    e2e_s = done_at - due_at / 1000
    # The timeline after the instant: the first and last run dispatched and started (all
    # started within: the issue 16 target), read after the CPU figures.
    disp = dispatch_times(reader, a.partitions)
    starts = [t for _, _, t in started_events(reader, a.partitions)]
    return {
        "dispatched_first_ms": min(disp, default=due_at) - due_at,
        "dispatched_last_ms": max(disp, default=due_at) - due_at,
        "started_first_ms": min(starts, default=due_at) - due_at,
        "started_last_ms": max(starts, default=due_at) - due_at,
        "schedule_jobs_per_s": round(a.jobs / sched_s),
        "e2e_jobs_per_s": round(a.jobs / e2e_s),
        "redis_cpu_us_per_job": round(sum(cpu.values()) / a.jobs, 1),
        "node_cpu_us_per_job": {name: round(us / a.jobs, 1) for name, us in cpu.items()},
        # What one node would carry at 100% of a core, at the CPU it spent per job here.
        "node_jobs_per_cpu_s": {name: round(a.jobs / (us / 1e6)) for name, us in cpu.items()},
        "dispatcher_cpu_us_per_job": round(dcpu / a.jobs, 1),
        "worker_cpu_us_per_job": round(wcpu / a.jobs, 1),
    }


def light(client: Client, reader: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Phase 2: light load, evenly spread; start lag, the machine's own stalls, lost/dups."""
    burst = started_events(reader, a.partitions)
    burst_ids = {rid for rid, _, _ in burst}
    burst_lag = [t - s for _, s, t in burst]
    n_light = int(a.light_rate * a.light_seconds)
    start = client.now_ms() + 1000
    step = 1000 / a.light_rate
    specs = [JobSpec("noop", None, run_at=int(start + i * step)) for i in range(n_light)]
    for i in range(0, n_light, 5000):
        client.schedule_many(specs[i : i + 5000])
    # The machine's own stalls during the light phase (cpu_probe.py): on a VM whose host
    # holds back its CPU every second or two, they, not rsched, set the lag's tail.
    probe = subprocess.Popen(
        [sys.executable, str(ROOT / "loadtest" / "cpu_probe.py"), str(a.light_seconds + 1)],
        stdout=subprocess.PIPE, text=True)
    wait_for(reader, a.partitions, a.jobs + n_light, 60 + a.light_seconds)
    stalls = json.loads(probe.communicate(timeout=60 + a.light_seconds)[0])
    time.sleep(0.5)
    events = started_events(reader, a.partitions)
    light_lag = [t - s for rid, s, t in events if rid not in burst_ids]
    runs = [rid for rid, _, _ in events]
    distinct = len(set(runs))
    return {
        "lag_p50_ms": pct(light_lag, 0.50),
        "lag_p99_ms": pct(light_lag, 0.99),
        "lag_max_ms": float(max(light_lag, default=0)),
        "burst_lag_p50_ms": pct(burst_lag, 0.50),
        "burst_lag_p99_ms": pct(burst_lag, 0.99),
        "probe_slice_median_ms": stalls["slice_median_ms"],
        "probe_slice_max_ms": stalls["slice_max_ms"],
        "probe_slices_over_3x": stalls["slices_over_3x"],
        "lost": a.jobs + n_light - distinct,
        "duplicates": len(runs) - distinct,
    }


def workload(url: str, reader: Any, nodes: dict[str, redis.Redis],
             a: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's two phases against a running Redis (one server or a cluster) at `url`;
    `reader` reads stats and events, `nodes` are the servers whose CPU is counted."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        settings = Settings.from_env(redis_url=url, partitions=a.partitions, wait_replicas=0)
        client = Client(settings=settings)
        client.partitions  # noqa: B018 - pins the partition count before the processes start
        procs = start_engine(url, a)
        time.sleep(1.0)
        result = {"jobs": a.jobs, **burst(client, reader, nodes, procs, a)}
        result.update(light(client, reader, a))
        return result
    finally:
        stop_engine(procs)


def single(a: argparse.Namespace) -> dict[str, Any]:
    """The workload on a private redis-server."""
    tmp = tempfile.mkdtemp(prefix="rsched-bench-")
    rproc, port = start_redis(tmp, a.aof)
    r = redis.Redis(port=port)
    try:
        result = workload(f"redis://127.0.0.1:{port}/0", r, {f"127.0.0.1:{port}": r}, a)
        result["aof"] = a.aof
        if a.commandstats:
            stats = sorted(r.info("commandstats").items(), key=lambda kv: -kv[1]["usec"])
            for name, st in stats[:15]:
                print(f"{name:28} calls={st['calls']:>9} usec={st['usec']:>11} "
                      f"per_call={st['usec_per_call']:.1f}", file=sys.stderr)
        return result
    finally:
        rproc.terminate()
        rproc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--light-rate", type=int, default=1000, help="jobs/s in the light phase")
    ap.add_argument("--light-seconds", type=float, default=5)
    ap.add_argument("--partitions", type=int, default=16)
    # No-op handlers end at once: what bounds a run is its round trips, and 1,000 runs in flight
    # let the worker's reads and reports go out in larger batches (500: ~13,400 jobs/s end to
    # end on the 2-core VM, 1,000: ~15,500, 250: ~11,100; docs/performance-history.md).
    ap.add_argument("--concurrency", type=int, default=1000,
                    help="worker concurrency (runs in flight)")
    ap.add_argument("--aof", action="store_true", help="AOF everysec (default off)")
    ap.add_argument("--commandstats", action="store_true", help="print Redis time per command")
    ap.add_argument("--cluster", action="store_true",
                    help="also a 3-master Redis Cluster, alternated with one Redis, and the "
                         "cost of WAIT durability (loadtest/bench_cluster.py)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --cluster: single/cluster alternations")
    ap.add_argument("--durability-jobs", type=int, default=20_000,
                    help="with --cluster: jobs per setting and round of the WAIT measurement")
    return ap.parse_args()


def main() -> None:
    a = parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server not found: install it (Debian: apt-get install redis-server)")
    if a.cluster:
        from bench_cluster import run_cluster_bench  # noqa: PLC0415 - only with --cluster

        run_cluster_bench(a)
        return
    print(json.dumps(single(a)))


if __name__ == "__main__":
    main()
