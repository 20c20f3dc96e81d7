"""A dispatcher killed and replaced under load: real processes (tests/fleet_support.py's helpers).

Killing one of two dispatchers may delay the partitions it held, by at most its lease plus one
renewal; the survivor's partitions must keep their normal start lag while the dead member is
still registered and its replacement joins under a new id.
"""

from __future__ import annotations

import signal
import time

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import FINISHES, STARTS
from support.fleet import (
    Fleet,
    balanced,
    counts,
    events,
    leases,
    report,
    schedule,
    started,
    wait_for,
)
from support.helpers import next_run

from rsched import Client, JobSpec

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures
LEASE_MS = 4000  # long enough that the dead member is still registered when its replacement is
RENEW_MS = LEASE_MS // 4  # LeaseKeeper.renew_every_ms
RATE = 250  # jobs/s
SECONDS = 10


def start_lags(evts: list[dict[str, str]], parts: set[int], since_ms: int) -> list[int]:
    """Start lag (ms) of the runs of `parts` scheduled from `since_ms`, sorted."""
    out = []
    for e in evts:
        start = e.get("t") if e["e"] == "started" else e.get("st")
        if start and int(e["s"]) >= since_ms and int(e["r"].split("-", 1)[0]) in parts:
            out.append(int(start) - int(e["s"]))
    return sorted(out)


def figures(lags: list[int]) -> dict[str, int]:
    return {"n": len(lags), "p50": lags[len(lags) // 2], "p99": lags[len(lags) * 99 // 100],
            "max": lags[-1]}


def test_killing_one_of_two_dispatchers_and_restarting_it_leaves_the_other_partitions_on_time(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    d2 = fleet.dispatcher("d2", LEASE_MS)
    fleet.dispatcher("d1", LEASE_MS)
    fleet.worker("w1", concurrency=64)
    wait_for(lambda: started(r, ["d1", "d2", "w1"]), 30, "processes to start", fleet)
    wait_for(lambda: balanced(r, ["d1", "d2"]), 15, "partitions split 8/8", fleet)

    now = client.now_ms()
    begin = now + 1000
    jobs = schedule(client, [  # keyed: spread evenly over the partitions
        JobSpec(type="record", run_at=begin + i * 1000 // RATE, idempotency_key=f"k{i}")
        for i in range(RATE * SECONDS)
    ])
    runs = {next_run(j) for j in jobs}
    wait_for(lambda: client.now_ms() > begin + 2000, 10, "two seconds of load")

    before = leases(r)
    healthy = {p for p, (owner, _) in before.items() if owner == "d1"}
    victim = {p for p, (owner, _) in before.items() if owner == "d2"}
    assert len(healthy) == len(victim) == 8
    d2.send(signal.SIGKILL)
    killed_ms = client.now_ms()
    wait_for(lambda: client.now_ms() > killed_ms + 1500, 5, "the restart delay")
    fleet.dispatcher("d3", LEASE_MS)  # the replacement, under a new id

    wait_for(lambda: set(counts(r, FINISHES)) >= runs, 40, "every job to finish", fleet)
    wait_for(lambda: balanced(r, ["d1", "d3"]), 15, "partitions split 8/8 again", fleet)
    evts = events(r)
    ours, theirs = start_lags(evts, healthy, begin), start_lags(evts, victim, begin)
    report("dispatcher_restart", t0, counts(r, STARTS), lease_ms=LEASE_MS,
           restart_after_ms=1500, survivor_partitions_start_lag_ms=figures(ours),
           killed_partitions_start_lag_ms=figures(theirs))
    assert len(ours) + len(theirs) == len(runs)
    assert ours[-1] < 1000, figures(ours)  # the survivor's partitions were never left unowned
    # ...and kept their normal start lag: 12-25 ms p99 on a quiet machine, 110 ms seen with a
    # second test run beside this one on the 2 cores, over 250 ms under heavier load; before the
    # fix 1,033-2,524 ms, so 500 still tells the two apart.
    assert figures(ours)["p99"] < 500, figures(ours)
    assert theirs[-1] <= LEASE_MS + RENEW_MS + 1000, figures(theirs)
