"""Job-index benchmark: filtered job listings over 1M (or 10M) indexed jobs, at the HTTP API.

The ``jobs`` table of a fresh archive (a Postgres database created and dropped here, or a SQLite
file) is filled in SQL alone with N rows: 20 common types and one rare type (1 job in 1,000),
4 queues, statuses (0.05% dead, 1% paused, 5% completed), latest runs (0.05% dead, 2% failed,
a third none) and idempotency keys (one job in ten).  Redis (a private redis-server) holds the
hashes of the jobs the measured filters match, consistent with their rows, since a listing
reads each listed job from Redis; the rest of the table only exists in SQL (the issue allows
10M to be simulated in the SQL table alone).  Then, through the real API app (Starlette's
TestClient, in process): the first page of each filter and sort and a walk of all its pages
(limit 50), each request timed.  Prints a last line of JSON.

    .venv/bin/python loadtest/bench_job_index.py [--rows 1000000] [--store postgres|sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from scratch_archive import add_store_args, scratch_archive  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from rsched.api.app import create_app  # noqa: E402
from rsched.archive import open_store  # noqa: E402
from rsched.archive.job_index import NO_NEXT_MS  # noqa: E402
from rsched.core.layout import J  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys  # noqa: E402

PARTITIONS = 16
RARE = "rare.type"
# One row per i in [0, N): the same expressions in both dialects (|| and CASE; printf/lpad).
ROW = """
  {pad_p} || '-bench' || {pad_i},
  i % 16,
  CASE WHEN i % 1000 = 7 THEN '{rare}' ELSE 'type.' || (i % 20) END,
  'q' || (i % 4),
  CASE WHEN i % 2000 = 3 THEN 'dead' WHEN i % 100 = 5 THEN 'paused'
       WHEN i % 20 = 9 THEN 'completed' ELSE 'scheduled' END,
  CASE WHEN i % 20 = 9 OR i % 2000 = 3 THEN {no_next}
       ELSE 1900000000000 + (i * 7919) % 86400000 END,
  1700000000000 + i * 10,
  1700000000000 + i * 10,
  CASE WHEN i % 2000 = 11 THEN 'dead' WHEN i % 50 = 13 THEN 'failed'
       WHEN i % 3 = 0 THEN NULL ELSE 'succeeded' END,
  CASE WHEN i % 3 = 0 AND i % 2000 <> 11 AND i % 50 <> 13 THEN 0
       ELSE 1750000000000 + (i * 104729) % 1000000000 END,
  CASE WHEN i % 10 = 1 THEN 'order-' || {pad_i} END,
  1700000000000 + i * 10, 0
"""
MEASURED = f"job_type = '{RARE}' OR status = 'dead' OR last_run_status = 'dead'"
RUN_STATE = {"succeeded": "succeeded", "failed": "retry_wait", "dead": "dead"}
CASES = [  # (name, query parameters)
    ("type=rare, created", {"type": RARE}),
    ("type=rare, nextRun", {"type": RARE, "sort": "nextRun"}),
    ("type=rare, lastRun", {"type": RARE, "sort": "lastRun"}),
    ("status=dead, created", {"status": "dead"}),
    ("status=dead, nextRun", {"status": "dead", "sort": "nextRun"}),
    ("lastRun=dead, lastRun", {"lastRun": "dead", "sort": "lastRun"}),
    ("type=rare&queue=q3, created", {"type": RARE, "queue": "q3"}),
    ("q=rare. (type prefix), created", {"q": "rare."}),
    ("type matching nothing", {"type": "no.such.type"}),
]


def fill_postgres(url: str, n: int) -> float:
    t0 = time.monotonic()
    row = ROW.format(pad_p="(i % 16)::text", pad_i="lpad(i::text, 10, '0')", rare=RARE,
                     no_next=NO_NEXT_MS)
    with psycopg.connect(url, autocommit=True) as conn:
        step = 1_000_000
        for lo in range(0, n, step):
            conn.execute(f"INSERT INTO jobs SELECT {row} FROM generate_series({lo}::bigint, "  # noqa: S608
                         f"{min(lo + step, n) - 1}) AS g(i)")
        conn.execute("VACUUM ANALYZE jobs")
    return time.monotonic() - t0


def fill_sqlite(path: str, n: int) -> float:
    import sqlite3

    t0 = time.monotonic()
    row = ROW.format(pad_p="(i % 16)", pad_i="printf('%010d', i)", rare=RARE, no_next=NO_NEXT_MS)
    conn = sqlite3.connect(path, isolation_level=None)
    step = 1_000_000
    for lo in range(0, n, step):
        conn.execute("BEGIN")
        conn.execute(f"WITH RECURSIVE s(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM s "  # noqa: S608
                     f"WHERE i < {min(lo + step, n) - 1}) INSERT INTO jobs SELECT {row} FROM s")
        conn.execute("COMMIT")
    conn.close()  # no ANALYZE: the archiver runs none (SqliteStore._index_hint plans instead)
    return time.monotonic() - t0


def fill_redis(server: RedisServer, rows: list[tuple[Any, ...]]) -> None:
    """The measured jobs' hashes (and their latest runs'), as the engine leaves them."""
    r = server.client()
    r.hset(keys.config(), "partitions", PARTITIONS)
    pipe = r.pipeline(transaction=False)
    for job_id, p, ty, q, status, next_ms, created, _, last, last_ms, _, _, _ in rows:
        h: dict[str, Any] = {J.type: ty, J.queue: q, J.created_ms: created}
        if status != "scheduled":
            h[J.status] = status
        if next_ms != NO_NEXT_MS:
            h[J.next_ms] = next_ms
        if last is not None:
            run_id = f"{job_id}@{last_ms}"
            h[J.last_run_id] = run_id
            pipe.hset(keys.run(p, run_id), mapping={"state": RUN_STATE[last],
                                                    "ended_ms": last_ms})
        pipe.hset(keys.job(p, job_id), mapping=h)
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()


def measure(api: TestClient, params: dict[str, str]) -> dict[str, Any]:
    times, cursor, items = [], None, 0
    while True:
        t0 = time.perf_counter()
        res = api.get("/jobs", params={**params, "limit": 50, **({"cursor": cursor} if cursor
                                                                 else {})})
        times.append((time.perf_counter() - t0) * 1000)
        body = res.json()
        assert res.status_code == 200 and body["indexed"], res.text
        items += len(body["jobs"])
        cursor = body["nextCursor"]
        if not cursor:
            break
        assert len(body["jobs"]) == 50, "a page before the last is full"
    later = sorted(times[1:] or [0.0])
    return {"items": items, "requests": len(times), "first_ms": round(times[0], 1),
            "later_p50_ms": round(statistics.median(later), 1),
            "later_p95_ms": round(later[int(len(later) * 0.95)], 1),
            "later_max_ms": round(later[-1], 1),
            "over_50ms": sum(t > 50 for t in times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    add_store_args(ap)
    args = ap.parse_args()
    with scratch_archive(args, "rsched-bench-index-") as (url, tmp), \
            closing(RedisServer()) as server:  # started once the store is filled
        store = open_store(url)
        store.connect()  # the migrations: an empty jobs table with its indexes
        fill_s = (fill_postgres(url, args.rows) if args.store == "postgres"
                  else fill_sqlite(str(tmp / "archive.db"), args.rows))
        measured = store.fetchall(f"SELECT * FROM jobs WHERE {MEASURED}")  # noqa: S608
        store.close()
        print(f"filled {args.rows} rows in {fill_s:.0f} s; {len(measured)} in Redis",
              file=sys.stderr)
        server.start()
        fill_redis(server, measured)
        results = {}
        app = create_app(Settings.from_env(redis_url=server.url), auth=False, archive_url=url)
        with TestClient(app) as api:
            measure(api, {"type": RARE})  # warm: connections, scripts, caches
            for name, params in CASES:
                results[name] = measure(api, params)
                print(f"{name}: {results[name]}", file=sys.stderr)
        print(json.dumps({"rows": args.rows, "store": args.store, "fill_s": round(fill_s),
                          "load_avg_1m": round(os.getloadavg()[0], 2), "cases": results}))


if __name__ == "__main__":
    main()
