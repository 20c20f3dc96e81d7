"""What sharing a queue between apps costs: two worker processes with different handlers (job
types a and b), N one-off jobs of each type scheduled at once, one dispatcher; seconds until
every job succeeded and the runs set aside (read first by the worker without the handler,
docs/workers.md).  The same with each app on a queue of its own, for comparison.  Prints one
line of JSON per layout.
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

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rsched import Client, JobSpec  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402

sys.path.insert(1, str(HERE))
from bench_engine import start_redis, succeeded  # noqa: E402


def engine(url: str, what: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, RSCHED_REDIS_URL=url, PYTHONPATH=str(HERE.parent),
               RSCHED_ALLOW_UNSAFE_REDIS="1", RSCHED_WAIT_REPLICAS="0")
    return subprocess.Popen([sys.executable, "-m", "rsched.cli", "--log-level", "WARNING", *what],
                            env=env, cwd=str(HERE))


def one(n: int, concurrency: int, shared: bool) -> dict[str, object]:
    tmp = tempfile.mkdtemp(prefix="rsched-shared-")
    server, port = start_redis(tmp, aof=False)
    url = f"redis://127.0.0.1:{port}/0"
    qa, qb = ("default", "default") if shared else ("qa", "qb")
    procs = [engine(url, ["dispatcher"])]
    for app, q in (("a", qa), ("b", qb)):
        procs.append(engine(url, ["worker", "--app", f"split_apps:{app}", "--queues", q,
                                  "--concurrency", str(concurrency)]))
    r = redis.Redis(port=port)
    client = Client(settings=Settings.from_env(redis_url=url, allow_unsafe_redis=True))
    try:
        while r.hlen(keys.workers()) < 2:
            time.sleep(0.05)
        specs = [JobSpec(t, queue=q) for _ in range(n) for t, q in (("a", qa), ("b", qb))]
        t0 = time.monotonic()
        client.schedule_many(specs)
        parts = client.partitions
        while succeeded(r, parts) < 2 * n:
            if time.monotonic() - t0 > 300:
                raise TimeoutError("the jobs did not all succeed")
            time.sleep(0.01)
        seconds = time.monotonic() - t0
        aside = sum(int(v) for v in r.hvals(keys.parked()))
        return {"layout": "one shared queue" if shared else "a queue per app", "jobs": 2 * n,
                "concurrency": concurrency, "seconds": round(seconds, 2),
                "jobs_per_s": round(2 * n / seconds), "set_aside": aside}
    finally:
        client.close()
        for p in procs:
            p.kill()
            p.wait()
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=5000, help="jobs of each type")
    ap.add_argument("--concurrency", type=int, default=16)
    A = ap.parse_args()
    for shared in (False, True):
        print(json.dumps(one(A.jobs, A.concurrency, shared)), flush=True)


if __name__ == "__main__":
    main()
