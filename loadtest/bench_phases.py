"""Redis work per job, phase by phase, over a job's whole life: schedule, claim, run.

A private redis-server; N one-off jobs scheduled (due now by default, or --due-in-ms later),
then one dispatcher process alone until every job is dispatched (claim), then one worker
process alone until every job succeeded (read, start, complete, ack: run), its handlers no-ops
or, with --body incr, the peer benchmark's one INCR (the worker's CPU per job is given too).
Per phase: Redis CPU per job (INFO cpu), commands per job by name (INFO commandstats: a
script's own commands included, EVALSHA counted once per call) and their usec; with --monitor,
the round trips per job (commands a client sent, not those a script ran) by name, read with
MONITOR (slow: use a smaller N).  The processes' own time-driven traffic (leases, heartbeats,
polling) is included: small next to N jobs.  With --due-in-ms the dispatcher starts before the
instant and holds its leases when it comes, so the claim phase also gives the dispatcher's own
CPU per job (its start-up left out) and the timeline of its claims: when the first and the
last job was dispatched after the instant, and how many claim calls.  Run the code of another
checkout with --code DIR (before/after pairs).  Prints a table, then a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--due-in-ms", type=int, default=0,
                    help="schedule the jobs this far ahead (0: due now)")
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--body", choices=("noop", "incr"), default="noop",
                    help="the handler: nothing, or the peer benchmark's one INCR on its own "
                         "connection (its Redis CPU then counts in the run phase)")
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--no-run", action="store_true",
                    help="stop after the claim phase (a quicker loop for the dispatcher)")
    ap.add_argument("--monitor", action="store_true", help="also count round trips (MONITOR)")
    ap.add_argument("--code", type=Path, default=HERE.parent,
                    help="the rsched checkout to run (default: this one)")
    return ap.parse_args()


A = parse_args()
sys.path.insert(0, str(A.code.resolve()))
sys.path.insert(1, str(HERE))

# rsched first, from --code: bench_engine puts this checkout on sys.path when imported.
from rsched import Client, JobSpec  # noqa: E402, I001
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402
from bench_engine import proc_cpu_us, start_redis, succeeded  # noqa: E402


def cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def dispatched(r: redis.Redis, partitions: int) -> int:
    p = r.pipeline(transaction=False)
    for i in range(partitions):
        p.hget(keys.stats(i), "dispatched")
    return sum(int(v or 0) for v in p.execute())


def leases_held(r: redis.Redis, partitions: int) -> bool:
    """Every partition's lease has an owner (the dispatcher is up and claiming)."""
    p = r.pipeline(transaction=False)
    for i in range(partitions):
        p.hget(keys.lease(i), "owner")
    return all(p.execute())


def dispatch_timeline(r: redis.Redis, partitions: int, at_ms: int) -> dict[str, Any]:
    """When the 'dispatched' events (one entry per claim call and 100 events) were written,
    in ms after the instant: first, median and last job; entries and jobs per entry."""
    stamps: list[tuple[int, int]] = []  # (ms after the instant, jobs)
    for i in range(partitions):
        for _sid, f in r.xrange(keys.events(i)):
            if f.get(b"e") == b"dispatched":
                stamps.append((int(f[b"t"]) - at_ms, int(f.get(b"n", b"1"))))
    stamps.sort()
    total = sum(n for _, n in stamps)
    seen, median = 0, 0
    for t, k in stamps:
        seen += k
        if seen * 2 >= total:
            median = t
            break
    return {"first_ms": stamps[0][0] if stamps else None, "median_ms": median,
            "last_ms": stamps[-1][0] if stamps else None, "entries": len(stamps),
            "jobs_per_entry": round(total / len(stamps), 1) if stamps else 0}


class Watch:
    """Commands per phase: INFO commandstats deltas, and with MONITOR the client commands."""

    def __init__(self, r: redis.Redis, port: int, monitor: bool) -> None:
        self.r = r
        self.sent: Counter[str] = Counter()
        self.mine: set[str] = set()  # the benchmark's own connections, not counted
        self.stop = threading.Event()
        self.thread = None
        if monitor:
            self.mon = redis.Redis(port=port).monitor().__enter__()
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            try:
                c = self.mon.next_command()
            except (redis.ConnectionError, ValueError):
                return
            if c["client_type"] != "lua" and c["client_address"] + ":" + \
                    str(c["client_port"]) not in self.mine:
                self.sent[str(c["command"]).split(" ", 1)[0].upper()] += 1

    def own(self, client: redis.Redis) -> None:
        """Leave the commands of this connection out of the round trips."""
        info = client.client_info()
        self.mine.add(str(info["addr"]))

    def stats(self) -> dict[str, tuple[int, int]]:
        """(calls, usec) per command so far."""
        return {k.removeprefix("cmdstat_").upper(): (int(v["calls"]), int(v["usec"]))
                for k, v in self.r.info("commandstats").items()}

    def take(self) -> Counter[str]:
        """The round trips counted since the last call (MONITOR lags a little: let it catch
        up first)."""
        if self.thread:
            time.sleep(0.5)
        out, self.sent = self.sent, Counter()
        return out


def phase(name: str, watch: Watch, r: redis.Redis, run: Any, n: int) -> dict[str, Any]:
    """Run ``run()`` and report Redis's work during it, per job."""
    watch.take()
    s0, c0 = watch.stats(), cpu_us(r)
    t0 = time.perf_counter()
    run()
    secs = time.perf_counter() - t0
    c1, s1 = cpu_us(r), watch.stats()
    sent = watch.take()
    cmds = {k: (v[0] - s0.get(k, (0, 0))[0], v[1] - s0.get(k, (0, 0))[1]) for k, v in s1.items()}
    cmds = {k: v for k, v in cmds.items() if v[0] > 0 and k not in ("INFO", "CLIENT|INFO")}
    return {
        "phase": name, "seconds": round(secs, 2),
        "redis_cpu_us_per_job": round((c1 - c0) / n, 2),
        "commands_per_job": round(sum(v[0] for v in cmds.values()) / n, 2),
        "command_usec_per_job": round(sum(v[1] for v in cmds.values()) / n, 2),
        "by_command": {k: {"per_job": round(v[0] / n, 3), "usec_per_job": round(v[1] / n, 2)}
                       for k, v in sorted(cmds.items(), key=lambda kv: -kv[1][1])},
        "round_trips_per_job": round(sum(sent.values()) / n, 4) if watch.thread else None,
        "round_trips": dict(sent.most_common()) if watch.thread else None,
    }


def engine(url: str, what: list[str]) -> subprocess.Popen[bytes]:
    # RSCHED_EVENTS_KEEP(_MS) 0: the claim timeline is read from every 'dispatched' event.
    env = dict(os.environ, RSCHED_REDIS_URL=url, RSCHED_PARTITIONS=str(A.partitions),
               PYTHONPATH=str(A.code.resolve()), RSCHED_ALLOW_UNSAFE_REDIS="1",
               RSCHED_WAIT_REPLICAS="0", RSCHED_EVENTS_KEEP="0", RSCHED_EVENTS_KEEP_MS="0")
    return subprocess.Popen([sys.executable, "-m", "rsched.cli", "--log-level", "WARNING", *what],
                            env=env, cwd=str(HERE))


def until(check: Any, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the phase did not end")
        time.sleep(0.02)


def stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    p.wait(30)


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="rsched-phases-")
    rproc, port = start_redis(tmp, aof=False)
    url = f"redis://127.0.0.1:{port}/0"
    r = redis.Redis(port=port)
    n = A.jobs
    try:
        watch = Watch(r, port, A.monitor)
        watch.own(r)
        client = Client(settings=Settings.from_env(redis_url=url, partitions=A.partitions,
                                                   wait_replicas=0))
        client.partitions  # noqa: B018 - pins the partition count, reads the clock
        at = client.now_ms() + A.due_in_ms

        def schedule() -> None:
            for i in range(0, n, 1000):
                client.schedule_many([JobSpec(A.body, None, run_at=at)
                                      for _ in range(min(1000, n - i))])

        out = [phase("schedule", watch, r, schedule, n)]
        procs: list[subprocess.Popen[bytes]] = []

        early = A.due_in_ms > 0
        dcpu: list[float] = []
        if early:  # up and holding its leases before the instant: its start-up not counted
            procs.append(engine(url, ["dispatcher"]))
            until(lambda: leases_held(r, A.partitions), 60)
            if client.now_ms() >= at:
                print("warning: the dispatcher came up after the instant: use a larger "
                      "--due-in-ms", file=sys.stderr)

        def claim() -> None:
            if not early:
                procs.append(engine(url, ["dispatcher"]))
            while client.now_ms() < at:
                time.sleep(0.002)
            dcpu.append(proc_cpu_us(procs[-1].pid))
            until(lambda: dispatched(r, A.partitions) >= n)
            dcpu.append(proc_cpu_us(procs[-1].pid))
            stop(procs.pop())

        wcpu: list[float] = []

        def run() -> None:
            procs.append(engine(url, ["worker", "--app", "noop_app:app",
                                      "--concurrency", str(A.concurrency)]))
            # The worker's CPU from its first hundredth of the jobs on: its start-up left out.
            until(lambda: succeeded(r, A.partitions) >= n // 100)
            wcpu.extend([proc_cpu_us(procs[-1].pid), succeeded(r, A.partitions)])
            until(lambda: succeeded(r, A.partitions) >= n)
            wcpu.append(proc_cpu_us(procs[-1].pid))
            stop(procs.pop())

        out.append(phase("claim", watch, r, claim, n))
        out[-1]["dispatcher_cpu_us_per_job"] = round((dcpu[1] - dcpu[0]) / n, 2)
        out[-1]["startup_included"] = not early
        out[-1]["timeline"] = dispatch_timeline(r, A.partitions, at)
        if not A.no_run:
            out.append(phase("run", watch, r, run, n))
            out[-1]["worker_cpu_us_per_job"] = round((wcpu[2] - wcpu[0]) / (n - wcpu[1]), 2)
        total = {
            "redis_cpu_us_per_job": round(sum(p["redis_cpu_us_per_job"] for p in out), 2),
            "commands_per_job": round(sum(p["commands_per_job"] for p in out), 2),
            "round_trips_per_job": round(sum(p["round_trips_per_job"] for p in out), 4)
            if A.monitor else None,
        }
        for p in out:
            print(f"{p['phase']:9} {p['redis_cpu_us_per_job']:7.2f} us/job Redis CPU, "
                  f"{p['commands_per_job']:6.2f} commands/job, "
                  f"round trips/job {p['round_trips_per_job']}, {p['seconds']} s",
                  file=sys.stderr)
            if "worker_cpu_us_per_job" in p:
                print(f"          worker CPU {p['worker_cpu_us_per_job']} us/job (after its "
                      "first hundredth of the jobs)", file=sys.stderr)
            if "dispatcher_cpu_us_per_job" in p:
                print(f"          dispatcher CPU {p['dispatcher_cpu_us_per_job']} us/job "
                      f"(start-up included: {p['startup_included']}); timeline {p['timeline']}",
                      file=sys.stderr)
            for k, v in list(p["by_command"].items())[:8]:
                print(f"          {k:14} {v['per_job']:7.3f}/job {v['usec_per_job']:7.2f} us/job",
                      file=sys.stderr)
            if p["round_trips"]:
                print(f"          sent: {p['round_trips']}", file=sys.stderr)
        print(json.dumps({"jobs": n, "due_in_ms": A.due_in_ms, "body": A.body, "code": str(A.code),
                          "total": total, "phases": out}))
    finally:
        watch.stop.set()
        rproc.terminate()
        rproc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
