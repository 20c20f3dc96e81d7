"""A queue-wide concurrency limit with real processes: two dispatchers, three workers at
concurrency 16, sync handlers (chaos_app's "sleep") that log each start and finish in order.

The queue's jobs are spread over every partition, with and without limit keys; the handlers'
own log must never show more runs of the queue at once than its limit (nor of a key more than
the key's), with and without a worker and a dispatcher killed with -9 mid-run (the dead
worker's permits expire with its runs' visibility, its runs are reclaimed and run again under
a permit of their own); every run ends succeeded, the limit is used, no attempt is spent on
waiting, and no permit or waiting run is left at the end.
"""

from __future__ import annotations

import time
from typing import cast

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import LOG
from support.fleet import Fleet, Proc, run_state, schedule, started, wait_for
from support.overlap import kill_mid_run, most_at_once

from rsched import Client, JobSpec
from rsched.rdb import keys

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

QUEUE, LIMIT, KEY_LIMIT, SLEEP_S = "default", 3, 2, 0.3
KEYED, UNKEYED = 12, 24


def running_worker(r: redis.Redis) -> str | None:
    """A worker with a run started and not finished, as the handlers logged it."""
    open_runs: dict[str, set[str]] = {}
    for line in (x.decode() for x in cast(list[bytes], r.lrange(LOG, 0, -1))):
        run_id, _, worker, what = line.split()
        runs = open_runs.setdefault(worker, set())
        (runs.add if what == "start" else runs.discard)(run_id)
    return next((w for w, runs in sorted(open_runs.items()) if runs), None)


def left(r: redis.Redis) -> tuple[int, int]:
    """(permits or reservations not expired, runs waiting) of the queue's limit."""
    now_ms = int(cast(float, r.time()[0]) * 1000)
    return (int(r.zcount(keys.queue_permits(QUEUE), f"({now_ms}", "+inf")),
            int(r.zcard(keys.queue_limit_waiting(QUEUE))))


def run_queue_fleet(r: redis.Redis, fleet: Fleet, client: Client, kill: bool) -> None:
    fleet.dispatcher("d1")
    fleet.dispatcher("d2")
    workers: dict[str, Proc] = {w: fleet.worker(w, concurrency=16) for w in ("w1", "w2", "w3")}
    wait_for(lambda: started(r, ["d1", "d2", *workers]), 60, "processes to start", fleet)
    client.set_queue_limit(QUEUE, concurrency=LIMIT)
    client.set_limit("tenant-*", concurrency=KEY_LIMIT)
    time.sleep(1)  # the workers read the queues' limits every 0.5 s
    # Idempotency keys spread the unkeyed jobs (a batch's jobs share a partition otherwise).
    specs = [JobSpec("sleep", {"sleeps": [SLEEP_S]}, idempotency_key=f"spread-{i}")
             for i in range(UNKEYED)]
    specs += [JobSpec("sleep", {"sleeps": [SLEEP_S]}, limit_key=f"tenant-{i % 2}")
              for i in range(KEYED)]
    jobs = schedule(client, specs)
    assert len({j.id.split("-", 1)[0] for j in jobs}) > 4  # spread over partitions
    if kill:
        name = wait_for(lambda: running_worker(r), 30, "runs to start", fleet)
        kill_mid_run(r, fleet, workers[name], name)
    wait_for(lambda: all(run_state(r, f"{j.id}@{j.next_ms}").get("state") == "succeeded"
                         for j in jobs), 180, "every run to succeed", fleet)
    log = [x.decode() for x in cast(list[bytes], r.lrange(LOG, 0, -1))]
    queue_most = most_at_once(log, dict.fromkeys((j.id for j in jobs), QUEUE))
    key_most = most_at_once(log, {j.id: j.limit_key for j in jobs if j.limit_key})
    assert queue_most == {QUEUE: LIMIT}, queue_most  # never above, and the limit is used
    assert all(n <= KEY_LIMIT for n in key_most.values()), key_most
    if not kill:  # waiting spent no attempt (a killed worker's runs were reclaimed: 2)
        assert {int(run_state(r, f"{j.id}@{j.next_ms}")["attempt"]) for j in jobs} == {1}
    wait_for(lambda: left(r) == (0, 0), 10, "no permit left", fleet)
    print(f"queue limits fleet (kill={kill}): most at once {queue_most}, keys {key_most}, "
          f"{len(log) // 2} starts for {len(jobs)} runs")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kill", [False, True], ids=["steady", "worker and dispatcher killed"])
def test_no_more_runs_of_a_queue_at_once_than_its_limit_across_a_fleet(
    r: redis.Redis, fleet: Fleet, client: Client, kill: bool
) -> None:
    run_queue_fleet(r, fleet, client, kill)
