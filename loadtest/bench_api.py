"""HTTP API benchmark: a private redis-server, one `rsched api` process (auth on), and real
Locust (headless, bounded run time, loopback only) for each user class of locustfile.py.

    .venv/bin/python loadtest/bench_api.py [--seconds 20] [--users 64]

Prints one JSON line per class and a last line with every figure: requests/s, jobs/s, latency
percentiles, and the API process's CPU time per request and per job (read from /proc), which is
the number to compare across machines and loads: throughput also depends on what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.api_process import running_api  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from rsched import Client, JobSpec  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402

LOCUST = str(Path(sys.executable).parent / "locust")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_locust(cls: str, host: str, seconds: int, users: int, env: dict[str, str],
               api_pid: int) -> dict[str, Any]:
    before = cpu_s(api_pid)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [LOCUST, "-f", str(ROOT / "loadtest" / "locustfile.py"), "--headless", "-u", str(users),
         "-r", str(users), "-t", f"{seconds}s", "--host", host, "--only-summary",
         "--stop-timeout", "5", cls],
        env=env, capture_output=True, text=True, timeout=seconds + 60, check=False,
    )
    used = cpu_s(api_pid) - before
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    locust_cpu = after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"locust printed no summary:\n{done.stdout}\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    out["class"] = cls
    out["api_cpu_s"] = round(used, 2)
    out["locust_cpu_s"] = round(locust_cpu, 2)
    out["seconds"] = seconds
    if out["requests"]:
        out["api_cpu_us_per_request"] = round(1e6 * used / out["requests"])
    return out


def history_jobs(client: Client, n_jobs: int, runs_each: int) -> list[str]:
    """Jobs whose history lists hold ``runs_each`` finished attempts, written as the engine's
    complete script writes them (the read path is what this measures)."""
    ids = []
    for j in client.schedule_many([client_spec() for _ in range(n_jobs)]):
        assert not isinstance(j, Exception)
        ids.append(j.id)
    pipe = client.r.pipeline(transaction=False)
    for jid in ids:
        p = int(jid.split("-")[0])
        for k in range(runs_each):
            rec = {"run": f"{jid}@{1_700_000_000_000 + k}", "attempt": 1, "status": "succeeded",
                   "worker": "w-bench", "sched_ms": 1_700_000_000_000 + k,
                   "started_ms": 1_700_000_000_010 + k, "ended_ms": 1_700_000_000_020 + k,
                   "duration_ms": 10, "result": json.dumps({"ok": k})}
            pipe.lpush(keys.history(p, jid), json.dumps(rec))
    pipe.execute()
    return ids


def client_spec() -> JobSpec:
    return JobSpec(type="report", payload={"n": 1}, run_at=4_102_444_800_000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--users", type=int, default=64)
    # Enough batches in flight to keep one API process busy (4 left it waiting on round trips).
    ap.add_argument("--batch-users", type=int, default=12)
    ap.add_argument("--classes", default="SingleJobUser,BatchUser,RunsUser")
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server not found: run `make redis`")
    tmp = Path(tempfile.mkdtemp(prefix="rsched-bench-api-"))
    results = []
    with RedisServer(aof=True) as server, \
            running_api(server.url, tmp, log_level="WARNING") as api:
        client = Client(settings=Settings.from_env(redis_url=server.url))
        env = dict(os.environ, RSCHED_REDIS_URL=server.url, RSCHED_API_KEY=api.admin)
        try:
            for cls in args.classes.split(","):
                users = args.batch_users if cls == "BatchUser" else args.users
                cls_env = dict(env)
                if cls == "RunsUser":
                    cls_env["RSCHED_RUNS_JOBS"] = ",".join(history_jobs(client, 200, 50))
                res = run_locust(cls, api.base, args.seconds, users, cls_env,
                                 api.proc.popen.pid)
                if cls == "BatchUser":
                    res["jobs_per_s"] = round(res["rps"] * res["batch_size"])
                    res["api_cpu_us_per_job"] = round(
                        1e6 * res["api_cpu_s"] / max(res["requests"] * res["batch_size"], 1), 1)
                elif cls == "SingleJobUser":
                    res["jobs_per_s"] = res["rps"]
                if cls != "BatchUser":
                    res.pop("batch_size", None)
                print(json.dumps(res), flush=True)
                results.append(res)
        finally:
            client.close()
    load = os.getloadavg()[0]
    print(json.dumps({"results": results, "load_avg_1m": round(load, 1),
                      "cores": os.cpu_count()}))


if __name__ == "__main__":
    main()
