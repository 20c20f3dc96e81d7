"""Redis memory per scheduled one-off job: N jobs due later (default 1,000,000) with a 2-field
payload on a private redis-server; used_memory after minus before, divided by N (the job hash,
its due-set entry and its share of the events stream).  Prints a last line of JSON."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_engine import start_redis  # noqa: E402 - puts this checkout on sys.path

from rsched import Client, JobSpec  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--listpack-value", type=int, default=None,
                    help="CONFIG SET hash-max-listpack-value first (Redis default 64: a job "
                         "hash with a longer value, e.g. its packed spec, is a hashtable)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rsched-memory-")
    rproc, port = start_redis(tmp, aof=False)
    r = redis.Redis(port=port)
    if a.listpack_value is not None:
        r.config_set("hash-max-listpack-value", a.listpack_value)
    try:
        client = Client(settings=Settings.from_env(redis_url=f"redis://127.0.0.1:{port}/0",
                                                   partitions=a.partitions, wait_replicas=0))
        client.partitions  # noqa: B018 - creates the partition count before the baseline
        before = int(r.info("memory")["used_memory"])
        at = client.now_ms() + 3_600_000
        t0 = time.perf_counter()
        for i in range(0, a.jobs, 5000):
            for res in client.schedule_many([
                    JobSpec("report.send", {"to": f"user-{i + k}@example.com", "n": i + k},
                            run_at=at) for k in range(min(5000, a.jobs - i))]):
                if isinstance(res, Exception):
                    raise res
        secs = time.perf_counter() - t0
        after = int(r.info("memory")["used_memory"])
        print(json.dumps({"jobs": a.jobs, "bytes_per_job": round((after - before) / a.jobs, 1),
                          "hash-max-listpack-value": r.config_get("hash-max-listpack-value")[
                              "hash-max-listpack-value"],
                          "used_memory_mb": round(after / 2**20, 1),
                          "schedule_jobs_per_s": round(a.jobs / secs)}))
    finally:
        rproc.terminate()
        rproc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
