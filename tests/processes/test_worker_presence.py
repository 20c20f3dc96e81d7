"""Dead workers in `rsched status`, GET /status and the dashboard: a worker whose process
heartbeats stopped is shown dead (and since when) after its --dead-after, the moment its runs
go to other workers (a record without one: after it missed three record beats), leaves the
list after WORKER_FORGET_MS, and a queue with runs waiting and no live worker is flagged."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import msgpack
import redis
from support.cli import ok
from support.fleet import TESTS
from support.helpers import settings
from support.processes import Proc, wait_for

from rsched import App, Client
from rsched.core import defaults
from rsched.engine.worker.worker import Worker
from rsched.rdb import keys
from rsched.service.status import op_status

S = 1000


def beat(r: redis.Redis, wid: str, beat_ms: int, queues: list[str],
         heartbeat_ms: int = defaults.HEARTBEAT_MS, dead_after_ms: int | None = None) -> None:
    """A worker's registry record, as its heartbeat writes it."""
    r.hset(keys.workers(), wid, msgpack.packb({
        "queues": queues, "inflight": 3, "pid": 1, "host": "h", "beat_ms": beat_ms,
        "concurrency": 8, "types": ["t"], "heartbeat_ms": heartbeat_ms,
        **({"dead_after_ms": dead_after_ms} if dead_after_ms else {})}))


def test_a_silent_worker_is_dead_after_three_heartbeats_and_forgotten_later(
    r: redis.Redis, client: Client
) -> None:
    now = client.now_ms()
    every = defaults.HEARTBEAT_MS
    dead_after = defaults.WORKER_DEAD_AFTER_BEATS * every
    beat(r, "live", now - 1 * S, ["default"])
    beat(r, "quiet-but-alive", now - dead_after + 2 * S, ["default"])
    beat(r, "dead", now - dead_after - 5 * S, ["default"])
    beat(r, "fast-dead", now - 2 * S, ["default"], heartbeat_ms=500)  # 3 beats of 0.5 s missed
    beat(r, "gone", now - dead_after - defaults.WORKER_FORGET_MS - 1 * S, ["default"])
    r.hset(keys.workers(), "torn", b"\xc1")
    s = client.run(op_status(client))
    state = {w.id: (w.alive, w.dead_since_ms) for w in s.workers}
    assert state == {
        "live": (True, None), "quiet-but-alive": (True, None),
        "dead": (False, now - 5 * S), "fast-dead": (False, now - 2 * S + 1500),
    }


def test_a_worker_is_judged_by_its_process_heartbeat_within_its_dead_after(
    r: redis.Redis, client: Client
) -> None:
    now = client.now_ms()
    d = defaults.DEAD_AFTER_MS
    record = {"beating": now - 4 * S, "silent": now - 5 * S, "marked": now - 1 * S,
              "starting": now - 1 * S, "gone-quiet": now - 4 * S}
    for wid, at in record.items():
        beat(r, wid, at, ["default"], dead_after_ms=d)
    # Process heartbeats (lua/alive.lua), every third of dead-after; "starting" has none yet,
    # "gone-quiet" was dropped once its runs were taken over.
    r.zadd(keys.alive(), {"beating": now - S // 2, "silent": now - 4 * S, "marked": 0})
    s = client.run(op_status(client))
    state = {w.id: (w.alive, w.dead_since_ms) for w in s.workers}
    assert state == {
        "beating": (True, None),  # its record is older than dead-after, its beat is not
        "silent": (False, now - 4 * S + d),
        "marked": (False, now - 1 * S),
        "starting": (True, None),
        "gone-quiet": (False, now - 4 * S + d),
    }
    assert {w.id: w.last_heartbeat_ms for w in s.workers}["beating"] == now - S // 2


def test_a_queue_with_runs_and_no_live_worker_is_flagged(
    r: redis.Redis, client: Client, redis_url: str
) -> None:
    now = client.now_ms()
    client.schedule("t", queue="orphans")
    client.schedule("t", queue="served")
    beat(r, "w1", now, ["served"])
    beat(r, "w2", now - 60 * S, ["orphans"])  # dead: it does not count
    queues = {q.queue: (q.length, q.live_workers, q.unserved)
              for q in client.run(op_status(client)).queues}
    assert queues == {"orphans": (1, 0, True), "served": (1, 1, False)}
    status = json.loads(ok(redis_url, "status", "--json"))
    assert {q["queue"]: q["unserved"] for q in status["queues"]} == {
        "orphans": True, "served": False}
    assert [w["deadSince"] is not None for w in status["workers"]] == [False, True]
    text = ok(redis_url, "status")
    assert "warning: queue 'orphans' holds 1 runs and no live worker reads it" in text
    assert "NONE: runs wait" in text and "DEAD since" in text and "workers 1 live, 1 dead" in text


def test_a_worker_killed_with_sigkill_shows_dead_within_its_dead_after(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", ""))
                                          if p))
    worker = Proc("worker", ["worker", "--app", "support.chaos_app:app"], env, tmp_path)
    procs = [worker]
    try:
        def workers() -> list[dict[str, object]]:
            return list(json.loads(ok(redis_url, "status", "--json"))["workers"])

        wait_for("the worker's heartbeat", lambda: [w["alive"] for w in workers()] == [True],
                 procs)
        worker.popen.send_signal(signal.SIGKILL)
        worker.popen.wait()
        killed = time.monotonic()
        procs.clear()
        (dead,) = wait_for("the worker shown dead",
                           lambda: [w for w in workers() if not w["alive"]], procs, 20)
        # The default --dead-after, 3 s (as its runs go elsewhere), not 3 record beats of 5 s;
        # the bound leaves a busy machine room.
        assert time.monotonic() - killed < 10
        assert dead["deadSince"] is not None
    finally:
        worker.stop()


def test_a_live_worker_deletes_records_of_workers_forgotten(redis_url: str, r: redis.Redis,
                                                            client: Client) -> None:



    now = client.now_ms()
    beat(r, "gone", now - defaults.WORKER_FORGET_MS - 60 * S, ["default"])
    beat(r, "recent", now - 60 * S, ["default"])

    async def prune() -> None:
        w = Worker(App("prune"), settings(redis_url), worker_id="pruner")
        await w.setup()
        try:
            await w.membership.prune_consumers_once()
        finally:
            await w.close()

    asyncio.run(prune())
    assert sorted(r.hkeys(keys.workers())) == [b"recent"]
