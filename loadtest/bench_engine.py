"""Engine benchmark (no HTTP): schedule N jobs due at one instant, run them with no-op handlers.

One dispatcher and one worker process against a private redis-server.  Phase 1 (burst): N jobs
(default 100,000) due at one instant a few seconds ahead; measures batch scheduling and
end-to-end throughput.  Phase 2 (light): 1,000 jobs/s spread evenly for a few seconds; measures
start lag (started - scheduled, both by Redis's clock), while cpu_probe.py measures how much the
machine itself stalls meanwhile.  Prints a last line of JSON.
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
from pathlib import Path

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


def proc_cpu_us(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc), in microseconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e6 / os.sysconf("SC_CLK_TCK")


def succeeded(r: redis.Redis, partitions: int) -> int:
    p = r.pipeline(transaction=False)
    for i in range(partitions):
        p.hget(keys.stats(i), "succeeded")
    return sum(int(v or 0) for v in p.execute())


def started_events(r: redis.Redis, partitions: int) -> list[tuple[str, int, int]]:
    """(run id, sched ms, started ms) of every start, read from the events streams: 'started'
    events, and outcome events that carry their run's start ('st', lua/complete.lua)."""
    out = []
    for i in range(partitions):
        last = "-"
        while True:
            batch = r.xrange(keys.events(i), min=last, count=10_000)
            if last != "-" and batch:
                batch = batch[1:]
            if not batch:
                break
            for eid, entry in batch:
                for _sid, f in expand(eid, entry):  # a script call's events share an entry
                    started = f[b"t"] if f[b"e"] == b"started" else f.get(b"st")
                    if started is not None:
                        rid = f[b"r"].decode()  # <job id>@<scheduled ms>
                        out.append((rid, int(rid.rpartition("@")[2]), int(started)))
            last = batch[-1][0].decode()
    return out


def pct(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def wait_for(r: redis.Redis, partitions: int, target: int, timeout: float) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if succeeded(r, partitions) >= target:
            return time.time()
        time.sleep(0.02)
    raise TimeoutError(f"only {succeeded(r, partitions)} of {target} jobs succeeded")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--light-rate", type=int, default=1000, help="jobs/s in the light phase")
    ap.add_argument("--light-seconds", type=float, default=5)
    ap.add_argument("--partitions", type=int, default=16)
    # No-op handlers end at once: what bounds a run is its round trips, and 1,000 runs in flight
    # let the worker's reads and reports go out in larger batches (500: ~13,400 jobs/s end to
    # end on the 2-core VM, 1,000: ~15,500, 250: ~11,100; README, Performance).
    ap.add_argument("--concurrency", type=int, default=1000,
                    help="worker concurrency (runs in flight)")
    ap.add_argument("--aof", action="store_true", help="AOF everysec (default off)")
    ap.add_argument("--commandstats", action="store_true", help="print Redis time per command")
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server not found: install it (Debian: apt-get install redis-server)")
    tmp = tempfile.mkdtemp(prefix="rsched-bench-")
    rproc, port = start_redis(tmp, a.aof)
    url = f"redis://127.0.0.1:{port}/0"
    env = dict(os.environ, RSCHED_REDIS_URL=url, RSCHED_PARTITIONS=str(a.partitions),
               PYTHONPATH=str(ROOT), RSCHED_ALLOW_UNSAFE_REDIS="1")
    r = redis.Redis(port=port)
    procs = []
    try:
        client = Client(settings=Settings.from_env(redis_url=url, partitions=a.partitions))
        client.partitions  # noqa: B018 - pins the partition count before the processes start
        cli = [sys.executable, "-m", "rsched.cli", "--log-level", "WARNING"]
        procs.append(subprocess.Popen(cli + ["dispatcher"], env=env, cwd=str(ROOT)))
        procs.append(subprocess.Popen(
            cli + ["worker", "--app", "loadtest.noop_app:app", "--concurrency",
                   str(a.concurrency)], env=env, cwd=str(ROOT)))
        time.sleep(1.0)

        # Phase 1: burst.
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
        cpu0 = cpu_us(r)
        dcpu0, wcpu0 = proc_cpu_us(procs[0].pid), proc_cpu_us(procs[1].pid)
        wait_s = (due_at - client.now_ms()) / 1000
        if wait_s < 0:
            print(f"warning: scheduling overran the due time by {-wait_s:.1f} s", file=sys.stderr)
        done_at = wait_for(r, a.partitions, a.jobs, 300)
        e2e_s = done_at - due_at / 1000
        cpu_burst = cpu_us(r) - cpu0
        dcpu = proc_cpu_us(procs[0].pid) - dcpu0
        wcpu = proc_cpu_us(procs[1].pid) - wcpu0
        burst = started_events(r, a.partitions)
        burst_lag = [t - s for _, s, t in burst]

        # Phase 2: light load, evenly spread.
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
        wait_for(r, a.partitions, a.jobs + n_light, 60 + a.light_seconds)
        stalls = json.loads(probe.communicate(timeout=60 + a.light_seconds)[0])
        time.sleep(0.5)
        events = started_events(r, a.partitions)
        burst_ids = {rid for rid, _, _ in burst}
        light_lag = [t - s for rid, s, t in events if rid not in burst_ids]

        runs = [rid for rid, _, _ in events]
        distinct = len(set(runs))
        total = a.jobs + n_light
        result = {
            "jobs": a.jobs,
            "schedule_jobs_per_s": round(a.jobs / sched_s),
            "e2e_jobs_per_s": round(a.jobs / e2e_s),
            "lag_p50_ms": pct(light_lag, 0.50),
            "lag_p99_ms": pct(light_lag, 0.99),
            "lag_max_ms": float(max(light_lag, default=0)),
            "burst_lag_p50_ms": pct(burst_lag, 0.50),
            "burst_lag_p99_ms": pct(burst_lag, 0.99),
            "redis_cpu_us_per_job": round(cpu_burst / a.jobs, 1),
            "dispatcher_cpu_us_per_job": round(dcpu / a.jobs, 1),
            "worker_cpu_us_per_job": round(wcpu / a.jobs, 1),
            "probe_slice_median_ms": stalls["slice_median_ms"],
            "probe_slice_max_ms": stalls["slice_max_ms"],
            "probe_slices_over_3x": stalls["slices_over_3x"],
            "lost": total - distinct,
            "duplicates": len(runs) - distinct,
            "aof": a.aof,
        }
        if a.commandstats:
            stats = sorted(r.info("commandstats").items(), key=lambda kv: -kv[1]["usec"])
            for name, st in stats[:15]:
                print(f"{name:28} calls={st['calls']:>9} usec={st['usec']:>11} "
                      f"per_call={st['usec_per_call']:.1f}", file=sys.stderr)
        print(json.dumps(result))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        rproc.terminate()
        rproc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
