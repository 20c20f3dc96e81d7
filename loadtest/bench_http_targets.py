"""HTTP target throughput: one `rsched worker --http --concurrency 200` process against a local
aiohttp server that answers 200 at once (a process of its own), N one-off HTTP target jobs due
at one instant, one dispatcher.  Reports the requests per second from the first to the last
success, the slowest 5 s window's rate until 95% are done (what "sustained" means; the tail
only drains what is in flight), and the worker's CPU per request.  Prints one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rsched import Client, JobSpec  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402

sys.path.insert(1, str(HERE))
from bench_engine import free_port, proc_cpu_us, start_redis, succeeded  # noqa: E402

SERVER = textwrap.dedent("""
    import sys
    from aiohttp import web

    async def ok(request):
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", ok)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
""")


def run(n: int, concurrency: int) -> dict[str, object]:
    tmp = tempfile.mkdtemp(prefix="rsched-http-bench-")
    server, port = start_redis(tmp, aof=False)
    url = f"redis://127.0.0.1:{port}/0"
    hook_port = free_port()
    env = dict(os.environ, RSCHED_REDIS_URL=url, PYTHONPATH=str(HERE.parent),
               RSCHED_ALLOW_UNSAFE_REDIS="1", RSCHED_WAIT_REPLICAS="0",
               RSCHED_HTTP_ALLOW=f"127.0.0.1:{hook_port}", RSCHED_HTTP_SIGNING_SECRETS="bench")
    procs = [subprocess.Popen([sys.executable, "-c", SERVER, str(hook_port)], env=env)]
    cli = [sys.executable, "-m", "rsched.cli", "--log-level", "WARNING"]
    procs.append(subprocess.Popen([*cli, "dispatcher"], env=env, cwd=tmp))
    worker = subprocess.Popen([*cli, "worker", "--http", "--concurrency", str(concurrency)],
                              env=env, cwd=tmp)
    procs.append(worker)
    r = redis.Redis(port=port)
    client = Client(settings=Settings.from_env(redis_url=url, allow_unsafe_redis=True))
    try:
        while r.hlen(keys.workers()) < 1:
            time.sleep(0.05)
        parts = client.partitions
        target = {"url": f"http://127.0.0.1:{hook_port}/hook"}
        warm = [JobSpec("http", {"i": -1}, target=target) for _ in range(200)]
        client.schedule_many(warm)
        while succeeded(r, parts) < len(warm):
            time.sleep(0.05)
        base = succeeded(r, parts)
        # All due at once, after scheduling them (at about 20,000 jobs/s on this machine).
        start_ms = int(time.time() * 1000) + 2000 + n // 20
        specs = [JobSpec("http", {"i": i}, target=target, run_at=start_ms) for i in range(n)]
        client.schedule_many(specs)
        if time.time() * 1000 > start_ms:
            raise RuntimeError("scheduling took longer than planned: the rate is not measured "
                               "from the start")
        while time.time() * 1000 < start_ms:
            time.sleep(0.01)
        cpu0 = proc_cpu_us(worker.pid)
        samples = [(time.monotonic(), 0)]
        while samples[-1][1] < n:
            time.sleep(0.25)
            samples.append((time.monotonic(), succeeded(r, parts) - base))
            if samples[-1][0] - samples[0][0] > 300:
                failed = sum(int(r.hget(keys.stats(i), "failed") or 0) for i in range(parts))
                raise TimeoutError(f"{samples[-1][1]} of {n} succeeded in 300 s, "
                                   f"{failed} attempts failed")
        cpu = proc_cpu_us(worker.pid) - cpu0
        first = next(t for t, done in samples if done > 0)
        last = samples[-1][0]
        # 5 s windows from the first success until 95% are done (the tail drains in-flight)
        body = [(t, done) for t, done in samples if t >= first and done <= 0.95 * n]
        windows = [(done2 - done1) / (t2 - t1) for (t1, done1) in body
                   for (t2, done2) in body if 5.0 <= t2 - t1 < 5.25]
        return {"requests": n, "concurrency": concurrency,
                "seconds": round(last - samples[0][0], 2),
                "requests_per_s": round(n / (last - first)),
                "slowest_5s_window_per_s": round(min(windows)) if windows else None,
                "per_5s": [round((d2 - d1) / (t2 - t1)) for (t1, d1), (t2, d2) in
                           zip(samples[::20], samples[20::20], strict=False)],
                "worker_cpu_ms_per_request": round(cpu / n / 1000, 3)}
    finally:
        client.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=80_000)
    ap.add_argument("--concurrency", type=int, default=200)
    a = ap.parse_args()
    print(json.dumps(run(a.jobs, a.concurrency)))


if __name__ == "__main__":
    main()
