"""Archive benchmark: events streams -> Postgres (or SQLite) through `rsched archiver` processes.

A private redis-server and a fresh Postgres database (created and dropped here), or with
``--store sqlite`` a SQLite file in a temporary directory.  Events are
written by a Lua script, as the engine's own scripts write them: dispatched, started, then
succeeded (90%) or failed, with types, workers, durations, results and errors.
Phase 1 (drain): N events (default 200,000) across 16 partitions wait in Redis; the archivers
start and move them.  drain_events_per_s counts from process start (imports, migrations);
drain_steady_events_per_s from the first archived batch.  Phase 2 (live): a producer process
appends events at a steady rate while the archivers run; the lag (events waiting in Redis, age of
the oldest) is sampled every 0.25 s.  CPU per event is read from /proc (the machine is shared, so
wall-clock rates move with its load).  Checks every event is in the table exactly once, and
counts the job index's rows (one per run's job: every run here has a job of its own).  Prints a
last line of JSON.

    .venv/bin/python loadtest/bench_archive.py [--events 200000] [--archivers 1] [--rate 20000]
        [--store postgres|sqlite] [--events-only]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from scratch_archive import add_store_args, scratch_archive  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from rsched.archive.lag import archive_lag  # noqa: E402
from rsched.archive.stores import open_store  # noqa: E402
from rsched.rdb import keys  # noqa: E402

PARTITIONS = 16
# The engine writes its events from Lua scripts (dispatched by claim, started by start, the
# outcome by complete); so does this producer, so the client costs next to nothing and Redis
# does the same XADD work.  KEYS[1] = a partition's events stream; ARGV = partition, first
# sequence number, runs, now_ms, and the prefixes of the partition's job and run keys ('': write
# events alone).  ~10% of runs fail, durations spread 0-1999 ms.  With the prefixes, each run's
# job hash and run hash hold what the engine's scripts leave there (type, queue, next run, last
# run, the run's state): the archiver reads them for the job index.
PRODUCE_LUA = """
local key, p, seq = KEYS[1], ARGV[1], tonumber(ARGV[2])
local n, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local job_prefix, run_prefix = ARGV[5], ARGV[6]
local types = {'email.send', 'report.build', 'invoice.charge', 'cache.warm', 'sync.crm', 'cleanup'}
local errors = {'TimeoutError: upstream did not answer in 30 s',
                "ValueError: invalid customer id 'c_0000'",
                'ConnectionResetError: [Errno 104] Connection reset by peer'}
for i = seq, seq + n - 1 do
  local job = p .. '-01J' .. string.format('%023d', i)
  local sched = now - (i * 7919) % 60000
  local run = job .. '@' .. sched
  local ty, w, d = types[i % #types + 1], 'w-host-' .. (i % 4), (i * 7907) % 2000
  redis.call('XADD', key, '*', 'e', 'dispatched', 'j', job, 'r', run, 'a', 1, 't', sched,
             's', sched, 'ty', ty, 'q', 'default')
  redis.call('XADD', key, '*', 'e', 'started', 'j', job, 'r', run, 'a', 1, 't', sched + 3,
             'w', w, 'f', 1, 'ty', ty, 's', sched)
  if job_prefix ~= '' then
    redis.call('HSET', job_prefix .. job, 't', ty, 'k', '* * * * *', 'n', sched + 60000,
               'l', run)
    redis.call('HSET', run_prefix .. run, 'state', i % 10 == 0 and 'retry_wait' or 'succeeded',
               'ended_ms', sched + 3 + d)
  end
  if i % 10 == 0 then
    redis.call('XADD', key, '*', 'e', 'failed', 'j', job, 'r', run, 'a', 1, 't', sched + 3 + d,
               'w', w, 'd', d, 'ty', ty, 'q', 'default', 's', sched, 'err', errors[i % 3 + 1])
  else
    redis.call('XADD', key, '*', 'e', 'succeeded', 'j', job, 'r', run, 'a', 1,
               't', sched + 3 + d, 'w', w, 'd', d, 'ty', ty, 'q', 'default', 's', sched,
               'res', '{"ok":true,"n":' .. i .. '}')
  end
end
return n * 3
"""
RUNS_PER_CALL = 50  # per partition per script call: short Redis pauses, like the engine's


def produce(url: str, n: int, start_seq: int = 0, rate: float = 0.0, jobs: bool = True) -> int:
    """Append n events (n a multiple of 3: whole runs), round-robin over the partitions, with
    their jobs' and runs' hashes unless ``jobs`` is False; rate > 0 paces them (events/s).
    Returns n."""
    r = redis.Redis.from_url(url)
    script = r.register_script(PRODUCE_LUA)
    runs, seq, t0 = n // 3, start_seq, time.monotonic()
    done = 0
    while done < runs:
        pipe = r.pipeline(transaction=False)
        step = 0
        for p in range(PARTITIONS):
            k = min(RUNS_PER_CALL, runs - done - step)
            if k <= 0:
                break
            prefixes = (keys.job(p, ""), keys.run(p, "")) if jobs else ("", "")
            script(keys=[keys.events(p)], args=[p, seq, k, int(time.time() * 1000), *prefixes],
                   client=pipe)
            seq += k
            step += k
        pipe.execute()
        done += step
        if rate:
            ahead = done * 3 / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    r.close()
    return runs * 3


def _produce_paced(url: str, n: int, rate: float, start_seq: int, jobs: bool) -> None:
    produce(url, n, start_seq, rate, jobs)


def start_archivers(count: int, redis_url: str, pg_url: str, batch: int
                    ) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, RSCHED_ARCHIVE_URL=pg_url)
    cmd = [sys.executable, "-m", "rsched.cli", "--allow-unsafe-redis", "--log-level", "WARNING",
           "archiver", "--batch", str(batch), "--poll-ms", "50"]
    return [subprocess.Popen(cmd, env=env, cwd=ROOT) for _ in range(count)]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def backend_pids(pg_url: str) -> list[int]:
    """The Postgres server processes serving the archivers' connections (none for SQLite)."""
    if pg_url.startswith("sqlite"):
        return []
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchall()
    return [int(pid) for (pid,) in rows]


def counts(url: str) -> tuple[int, int, int]:
    """Events rows, distinct event ids, job-index rows."""
    store = open_store(url)
    try:
        ((rows, distinct),) = store.fetchall(
            "SELECT count(*), count(DISTINCT sid_ms || '-' || sid_seq || '-' || part) FROM events")
        ((indexed,),) = store.fetchall("SELECT count(*) FROM jobs")
        return int(rows), int(distinct), int(indexed)
    finally:
        store.close()


def wait_drained(r: redis.Redis, total: int, timeout_s: float
                 ) -> tuple[float, list[float], float | None]:
    """Poll until no event waits; returns (seconds, sampled lag ages, steady events/s).

    Steady: from the first sample with some events archived, so process start-up and
    migrations are left out."""
    t0 = time.monotonic()
    ages: list[float] = []
    first: tuple[float, int] | None = None
    while time.monotonic() - t0 < timeout_s:
        lag = archive_lag(r, PARTITIONS)
        now = time.monotonic()
        ages.append(lag.seconds)
        if first is None and lag.entries < total:
            first = (now, lag.entries)
        if lag.entries == 0 and total:
            steady = first[1] / (now - first[0]) if first and now - first[0] > 1 else None
            return now - t0, ages, steady
        time.sleep(0.05)
    raise SystemExit(f"archive did not drain in {timeout_s} s: {archive_lag(r, PARTITIONS)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--archivers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2000, help="events per partition per round")
    ap.add_argument("--rate", type=float, default=20_000, help="phase 2 events/s (0 = skip)")
    ap.add_argument("--seconds", type=float, default=10.0, help="phase 2 length")
    add_store_args(ap)
    ap.add_argument("--events-only", action="store_true",
                    help="write no job or run hashes: the job index reads nothing and deletes")
    args = ap.parse_args()
    with scratch_archive(args, "rsched-bench-archive-") as (pg_url, _):
        run(args, pg_url)


def run(args: argparse.Namespace, pg_url: str) -> None:
    """Both phases against a fresh Redis and the archive at ``pg_url``; prints the JSON."""
    server = RedisServer()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server.start()
        r = server.client()
        r.hset(keys.config(), "partitions", PARTITIONS)
        t0 = time.monotonic()
        events = produce(server.url, args.events // 3 * 3, jobs=not args.events_only)
        gen_s = time.monotonic() - t0
        print(f"generated {events} events in {gen_s:.1f} s", file=sys.stderr)

        redis_cpu0 = redis_cpu_s(r)
        procs = start_archivers(args.archivers, server.url, pg_url, args.batch)
        drain_s, _, steady = wait_drained(r, events, 600)
        # CPU per event, independent of what else the machine runs (it is shared): the archiver
        # processes (start-up and migrations included), their Postgres backends, Redis.
        cpu = {
            "archiver_cpu_us_per_event": sum(cpu_s(p.pid) for p in procs) / events * 1e6,
            "postgres_backend_cpu_us_per_event":
                sum(cpu_s(pid) for pid in backend_pids(pg_url)) / events * 1e6,
            "redis_cpu_us_per_event": (redis_cpu_s(r) - redis_cpu0) / events * 1e6,
        }
        cpu = {k: round(v, 1) for k, v in cpu.items()}
        print(f"cpu: {cpu}", file=sys.stderr)
        rows, distinct, indexed = counts(pg_url)
        # drain_s includes process start-up and migrations: a conservative rate
        drain_rate = events / drain_s
        print(f"drained {events} events in {drain_s:.2f} s: {drain_rate:,.0f} events/s; "
              f"rows {rows}, distinct {distinct}", file=sys.stderr)

        live: dict[str, float] = {}
        n = live_events = int(args.rate * args.seconds) // 3 * 3  # whole runs: exactly n events
        if n:
            producer = multiprocessing.Process(target=_produce_paced,
                                               args=(server.url, n, args.rate, 10**9,
                                                     not args.events_only))
            t1 = time.monotonic()
            producer.start()
            ages: list[float] = []
            backlog: list[int] = []
            while producer.is_alive():
                lag = archive_lag(r, PARTITIONS)
                ages.append(lag.seconds)
                backlog.append(lag.entries)
                time.sleep(0.25)
            producer.join()
            produced_s = time.monotonic() - t1
            tail_s, tail_ages, _ = wait_drained(r, n, 600)
            ages += tail_ages
            ages.sort()
            live = {
                "live_rate_events_per_s": round(n / produced_s),
                "live_lag_p50_s": round(ages[len(ages) // 2], 3),
                "live_lag_max_s": round(ages[-1], 3),
                "live_backlog_max_events": max(backlog or [0]),
                "live_catch_up_after_producer_s": round(tail_s, 3),
            }
            print(f"live: {live}", file=sys.stderr)
            rows, distinct, indexed = counts(pg_url)
        expected = events + live_events
        result = {
            "events": events, "store": args.store, "archivers": args.archivers,
            "partitions": PARTITIONS, "batch_per_partition": args.batch,
            "drain_events_per_s": round(drain_rate), "drain_s": round(drain_s, 3),
            "drain_steady_events_per_s": round(steady or 0), **cpu,
            "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            **live,
            "rows": rows, "expected_rows": expected, "duplicates": rows - distinct,
            "job_index_rows": indexed, "job_hashes": not args.events_only,
            "lost": expected - distinct,
        }
        print(json.dumps(result))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.close()


if __name__ == "__main__":
    main()
