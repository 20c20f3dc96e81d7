"""Start lag at light load on one Redis and on a 3-master Redis Cluster, alternated.

One dispatcher and one worker process (concurrency 16, no-op handlers); a client schedules one
job every `--interval-ms` (default 50) for `--seconds`, due now (or `--ahead-ms` later, which
sends it through the dispatcher's sleep and wake-up instead of straight to its queue).  Start lag
is the handler's start minus the run's scheduled time, both by Redis's clock (the events streams);
it splits into the dispatch part (scheduled -> the 'dispatched' event) and the worker part
('dispatched' -> started).  `--code DIR` (repeatable) runs the dispatcher, worker and client of
another checkout (e.g. an older commit, `git archive`d), so before/after pairs come from the same
minutes: rounds alternate codes, and within a code one Redis and the cluster.  Prints a table,
then a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHILD_FLAG = "--child"


def child(root: str, url: str, partitions: int, n: int, interval_ms: int, ahead_ms: int) -> None:
    """In a process of the code under test: schedule, wait, print the runs' times as JSON."""
    sys.path.insert(0, root)
    from rsched import Client  # noqa: PLC0415 - the code under test, not this checkout's
    from rsched.archive.events import expand  # noqa: PLC0415
    from rsched.core.settings import Settings  # noqa: PLC0415
    from rsched.rdb import keys  # noqa: PLC0415

    client = Client(settings=Settings.from_env(redis_url=url, partitions=partitions,
                                               wait_replicas=0))
    client.partitions  # noqa: B018 - pins the partition count
    time.sleep(2.0)  # the dispatcher and worker started with this process: let them settle
    t = time.monotonic()
    for _ in range(n):
        if ahead_ms:
            client.schedule("noop", None, run_at=client.now_ms() + ahead_ms)
        else:
            client.schedule("noop", None)
        t += interval_ms / 1000
        time.sleep(max(0.0, t - time.monotonic()))
    r = client.r
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = sum(int(r.hget(keys.stats(p), "succeeded") or 0) for p in range(partitions))
        if done >= n:
            break
        time.sleep(0.05)
    dispatched: dict[str, int] = {}
    started: dict[str, int] = {}
    for p in range(partitions):
        for eid, entry in r.xrange(keys.events(p), count=1_000_000):
            for _sid, f in expand(eid, entry):
                rid = f.get(b"r", b"").decode()
                if f.get(b"e") == b"dispatched":
                    dispatched[rid] = int(f[b"t"])
                st = f[b"t"] if f.get(b"e") == b"started" else f.get(b"st")
                if st is not None:
                    started[rid] = int(st)
    print(json.dumps({"dispatched": dispatched, "started": started}))


def pct(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0


def measure(code: str, url: str, a: argparse.Namespace) -> dict[str, Any]:
    """The engine of `code` on `url`: start lag and its two parts (p50, p99, max in ms)."""
    env = dict(os.environ, RSCHED_REDIS_URL=url, RSCHED_PARTITIONS=str(a.partitions),
               PYTHONPATH=code, RSCHED_ALLOW_UNSAFE_REDIS="1", RSCHED_WAIT_REPLICAS="0")
    cli = [sys.executable, "-m", "rsched.cli", "--log-level", "ERROR"]
    procs = [subprocess.Popen(cli + ["dispatcher"], env=env, cwd=code),
             subprocess.Popen(cli + ["worker", "--app", "loadtest.noop_app:app",
                                     "--concurrency", "16"], env=env, cwd=code)]
    n = int(a.seconds * 1000 / a.interval_ms)
    try:
        out = subprocess.run(
            [sys.executable, __file__, CHILD_FLAG, code, url, str(a.partitions), str(n),
             str(a.interval_ms), str(a.ahead_ms)],
            env=env, cwd=code, capture_output=True, text=True, timeout=a.seconds + 90, check=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    runs = json.loads(out.stdout.strip().splitlines()[-1])
    lag, dispatch, work = [], [], []
    for rid, st in runs["started"].items():
        sched = int(rid.rpartition("@")[2])
        lag.append(st - sched)
        if (d := runs["dispatched"].get(rid)) is not None:
            dispatch.append(d - sched)
            work.append(st - d)
    def three(v: list[int]) -> list[int]:
        return [pct(v, 0.5), pct(v, 0.99), max(v, default=0)]
    return {"jobs": n, "ran": len(lag), "lag": three(lag), "dispatch": three(dispatch),
            "worker": three(work)}


def single(code: str, a: argparse.Namespace) -> dict[str, Any]:
    from bench_engine import start_redis  # noqa: PLC0415 - the parent only

    tmp = tempfile.mkdtemp(prefix="rsched-bench-")
    proc, port = start_redis(tmp, aof=False)
    try:
        return measure(code, f"redis://127.0.0.1:{port}/0", a)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def cluster(code: str, a: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))  # the test fixtures' redis-server processes
    from support.redis_server import RedisCluster  # noqa: PLC0415

    with RedisCluster(masters=3, replicas=0) as c:
        return measure(code, c.cluster_url, a)


def report(results: dict[str, dict[str, list[dict[str, Any]]]], a: argparse.Namespace) -> None:
    how = f"due {a.ahead_ms} ms after scheduling" if a.ahead_ms else "due now"
    print(f"\nStart lag, a job every {a.interval_ms} ms for {a.seconds:g} s ({how}), "
          f"{a.rounds} round(s) alternated; ms, p50 / p99 / max per round")
    for code, modes in results.items():
        print(f"code {code}")
        for mode in ("single", "cluster"):
            for part in ("lag", "dispatch", "worker"):
                cells = "  ".join("/".join(str(x) for x in r[part]) for r in modes[mode])
                print(f"  {mode:8} {part:9} {cells}")
        ratios = [c["lag"][1] / max(s["lag"][1], 1)
                  for s, c in zip(modes["single"], modes["cluster"], strict=True)]
        print(f"  p99 cluster / one Redis, per round: "
              f"{', '.join(f'{x:.2f}x' for x in ratios)}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        root, url, parts, n, interval, ahead = sys.argv[2:8]
        child(root, url, int(parts), int(n), int(interval), int(ahead))
        return
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval-ms", type=int, default=50)
    ap.add_argument("--ahead-ms", type=int, default=0,
                    help="schedule each job due this much later (0: due now)")
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--code", action="append", default=[],
                    help="a checkout to run (repeatable; default: this one)")
    a = ap.parse_args()
    codes = [str(Path(c).resolve()) for c in a.code] or [str(ROOT)]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {"single": [], "cluster": []} for c in codes}
    for i in range(a.rounds):
        for code in codes:
            for mode, run in (("single", single), ("cluster", cluster)):
                print(f"round {i + 1}/{a.rounds}: {code} {mode} ...", file=sys.stderr,
                      flush=True)
                results[code][mode].append(run(code, a))
                print(json.dumps(results[code][mode][-1]), file=sys.stderr, flush=True)
    report(results, a)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
