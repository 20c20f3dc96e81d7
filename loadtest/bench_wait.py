"""Many waiting requests: N concurrent `GET /runs/{id}?wait=30` on one `rsched api` process
(auth off, a private redis-server) while the N runs they wait for complete, run by a
`rsched dispatcher` and a `rsched worker` process (loadtest/noop_app.py).

    .venv/bin/python loadtest/bench_wait.py [--runs 1000]

Prints one JSON line: how long after its run ended each request answered (p50, p99, max, from
the run's endedAt on Redis's clock to the answer's arrival), the API process's CPU time per
waiting request (from /proc) and Redis's commands per waiting request (INFO commandstats,
every command the API and the engine sent, less what the engine alone sends for the same runs
in a first round without waiters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.api_process import running_api  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from rsched import Client, JobSpec  # noqa: E402
from rsched.core.ids import run_id as make_run_id  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def commands(r: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


def schedule(client: Client, n: int, delay_s: float) -> list[str]:
    at = datetime.fromtimestamp(client.now_ms() / 1000 + delay_s).astimezone()
    jobs = client.schedule_many([JobSpec("noop", {"i": i}, run_at=at) for i in range(n)])
    return [make_run_id(j.id, j.next_ms or 0) for j in jobs if not isinstance(j, Exception)]


def engine(url: str, cwd: Path) -> list[subprocess.Popen[bytes]]:
    """A dispatcher and a worker process running loadtest/noop_app.py's handlers."""
    env = dict(os.environ, RSCHED_REDIS_URL=url, PYTHONPATH=str(ROOT / "loadtest"))
    out = open(cwd / "engine.log", "ab")
    return [subprocess.Popen([sys.executable, "-m", "rsched.cli", "--log-level", "WARNING",
                              *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
            for args in (["dispatcher"], ["worker", "--app", "noop_app:app"])]


def iso_ms(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000


async def _get(port: int, path: str) -> tuple[float, dict[str, Any]]:
    """One HTTP/1.1 GET on a connection of its own, on raw asyncio streams (an HTTP client
    library would cost this process more per answer than the API spends on it): when the
    answer arrived (ms) and its JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    arrived = time.time() * 1000
    writer.close()
    return arrived, json.loads(raw.split(b"\r\n\r\n", 1)[1])


async def wait_all(port: int, run_ids: list[str]) -> list[float]:
    """Every waiting request at once; each answer's delay after its run's end."""
    async def one(rid: str) -> float:
        arrived, body = await _get(port, f"/runs/{rid}?wait=30")
        assert body["status"] == "succeeded", body
        return arrived - iso_ms(body["endedAt"])

    return list(await asyncio.gather(*(one(rid) for rid in run_ids)))


def until_done(client: Client, run_ids: list[str]) -> None:
    for rid in run_ids:
        client.wait(rid, timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rsched-bench-wait-"))
    with RedisServer() as server:
        client = Client(settings=Settings.from_env(redis_url=server.url))
        r = redis.Redis.from_url(server.url)
        # The admin and read keys running_api makes go unused: the API runs --no-auth.
        with running_api(server.url, tmp, "--no-auth", log_level="WARNING") as api:
            pid = api.proc.popen.pid
            procs = engine(server.url, tmp)
            try:
                # The engine's own commands for N runs, without anyone waiting.
                c0 = commands(r)
                until_done(client, schedule(client, args.runs, 0.5))
                engine_cmds = commands(r) - c0
                # Then N runs due in 4 s, each waited for by a request opened before.
                run_ids = schedule(client, args.runs, 4.0)
                cpu0, c1 = cpu_s(pid), commands(r)
                delays = sorted(asyncio.run(wait_all(api.port, run_ids)))
                api_cpu, total_cmds = cpu_s(pid) - cpu0, commands(r) - c1
            finally:
                for p in procs:
                    p.terminate()
                    p.wait(timeout=15)
                client.close()
    n = len(delays)
    out: dict[str, Any] = {
        "waiting_requests": n,
        "answer_after_end_ms": {"p50": round(delays[n // 2]), "p99": round(delays[n * 99 // 100]),
                                "max": round(delays[-1])},
        "api_cpu_ms_per_request": round(1000 * api_cpu / n, 2),
        "redis_commands_per_request": round((total_cmds - engine_cmds) / n, 2),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
