"""Redis memory with a bound and no archiver: 100,000 one-off jobs through a real dispatcher and
worker, the dispatcher trimming the events streams to RSCHED_EVENTS_KEEP entries (checked while
the jobs run and after), and the finished jobs expiring after RSCHED_FINISHED_TTL_MS, so Redis's
used memory goes back to where it started.  With an archiver, the same trimming keeps every
event until it is archived, whatever the bounds say."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import pytest
import redis
from support import fleet as fleet_support
from support.fleet import PARTITIONS, Fleet, wait_for

from rsched import Client, JobSpec
from rsched.archive import open_store
from rsched.core import defaults
from rsched.rdb import keys

pytestmark = [pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

JOBS = 100_000
KEEP = 50  # entries per partition's stream (an entry holds up to 100 events of one call)
NODE = 100  # stream-node-max-entries: approximate trimming leaves up to a node more
TRIM_S = defaults.EVENTS_TRIM_EVERY_MS / 1000


def _lengths(r: redis.Redis) -> list[int]:
    pipe = r.pipeline(transaction=False)
    for p in range(PARTITIONS):
        pipe.xlen(keys.events(p))
    return cast(list[int], pipe.execute())


def _added(r: redis.Redis) -> int:
    """Entries ever added to the streams (XINFO STREAM entries-added, Redis 7)."""
    pipe = r.pipeline(transaction=False)
    for p in range(PARTITIONS):
        pipe.xinfo_stream(keys.events(p))
    return sum(int(i["entries-added"]) for i in pipe.execute(raise_on_error=False)
               if isinstance(i, dict))  # a stream not made yet: an error


def _succeeded(r: redis.Redis) -> int:
    pipe = r.pipeline(transaction=False)
    for p in range(PARTITIONS):
        pipe.hget(keys.stats(p), "succeeded")
    return sum(int(v or 0) for v in pipe.execute())


def _streams(r: redis.Redis) -> int:
    """MEMORY USAGE of every events stream, whole."""
    pipe = r.pipeline(transaction=False)
    for p in range(PARTITIONS):
        pipe.memory_usage(keys.events(p), samples=0)
    return sum(int(m or 0) for m in pipe.execute())


def _used(r: redis.Redis) -> int:
    return int(cast(dict[str, int], r.info("memory"))["used_memory"])


def test_a_hundred_thousand_jobs_without_an_archiver_leave_redis_memory_where_it_was(
        fleet: Fleet, client: Client, r: redis.Redis) -> None:
    fleet.env.update(RSCHED_EVENTS_KEEP=str(KEEP), RSCHED_FINISHED_TTL_MS="1000",
                     RSCHED_RUN_TTL_MS="1000")
    fleet.dispatcher("d1")
    fleet.worker("w1", app="support.dashboard_app:app", concurrency=200)
    wait_for(lambda: r.zcard(keys.dispatchers()) >= 1 or None, 30, "the dispatcher", fleet)
    r.set("warm", 1)
    before = _used(r)
    t0 = time.monotonic()
    samples: list[tuple[float, int, int]] = []  # (s since t0, longest stream, entries added)

    def sample() -> None:
        samples.append((time.monotonic() - t0, max(_lengths(r)), _added(r)))

    for i in range(0, JOBS, 1_000):
        client.schedule_many([JobSpec("tick", queue="default") for _ in range(1_000)])
        if i % 10_000 == 0:
            sample()
    while _succeeded(r) < JOBS:
        assert time.monotonic() - t0 < 400, f"{_succeeded(r)} of {JOBS} ran\n{fleet.logs()}"
        sample()
        time.sleep(0.5)
    peak = max(length for _, length, _ in samples)
    added = samples[-1][2]
    assert added > 2 * PARTITIONS * (KEEP + NODE)  # the bound was passed over and over ...
    # ... and held while the jobs ran: a stream holds at most the bound, a node, and what the
    # busiest trim interval (plus a sample's lag) added to one partition's stream.
    busiest = max(b[2] - a[2] for a in samples for b in samples
                  if 0 <= b[0] - a[0] <= 2 * TRIM_S + 1)
    assert peak <= KEEP + NODE + busiest / PARTITIONS * 2, (peak, busiest, samples)
    wait_for(lambda: max(_lengths(r)) <= KEEP + NODE or None, 3 * TRIM_S + 5,
             "every stream within its bound once the jobs ran", fleet)

    def back_to_start() -> tuple[int, int] | None:
        """(key count, memory grown) once only the bounded streams hold more than at the start
        (a 2 MB allowance for the allocator: 100,000 kept jobs would take about 45 MB)."""
        size, grown = r.dbsize(), _used(r) - before

        return (size, grown) if size < 200 and grown - _streams(r) < 2_000_000 else None

    size, grown = wait_for(back_to_start, 60, "the finished jobs to expire", fleet)
    print(f"streams: {_streams(r)} B in {sum(_lengths(r))} entries; {size} keys")
    print(f"100,000 jobs in {samples[-1][0]:.1f} s: {added} stream entries added, longest "
          f"stream {peak} while running; used_memory grew {grown} B")


def test_with_an_archiver_the_trimming_keeps_every_event_until_it_is_archived(
        fleet: Fleet, client: Client, r: redis.Redis, tmp_path: Path) -> None:
    jobs = 20_000
    url = f"sqlite:///{tmp_path}/archive.db"
    fleet.env.update(RSCHED_EVENTS_KEEP="1", RSCHED_EVENTS_KEEP_MS="1")  # would drop almost all
    fleet.archiver("a1", url)

    def groups() -> bool | None:
        pipe = r.pipeline(transaction=False)
        for p in range(PARTITIONS):
            pipe.xinfo_groups(keys.events(p))
        return all(g for g in pipe.execute(raise_on_error=False)
                   if not isinstance(g, Exception)) or None

    wait_for(lambda: r.exists(keys.events(PARTITIONS - 1)) and groups(), 60,
             "the archiver's groups", fleet)
    fleet.dispatcher("d1")
    fleet.worker("w1", app="support.dashboard_app:app", concurrency=200)
    t0 = time.monotonic()
    for _ in range(0, jobs, 1_000):  # over 3 trim rounds or more, the archiver reading along
        client.schedule_many([JobSpec("tick") for _ in range(1_000)])
        time.sleep(3 * TRIM_S / (jobs / 1_000))
    wait_for(lambda: _succeeded(r) >= jobs or None, 300, "every job to run", fleet)
    assert time.monotonic() - t0 >= 3 * TRIM_S
    store = open_store(url)
    try:
        def archived() -> int | None:
            n = int(store.fetchall("SELECT count(*) FROM events WHERE event = 'succeeded'")[0][0])
            return n if n >= jobs else None

        assert wait_for(archived, 60, "every succeeded event in the archive", fleet) == jobs
        assert int(store.fetchall("SELECT count(*) FROM events WHERE event = 'scheduled'")[0][0]) \
            == jobs
    finally:
        store.close()
    assert "trimming the streams failed" not in fleet.logs()
