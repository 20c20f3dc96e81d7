"""Per-key concurrency limits with real processes: two dispatchers, three workers at concurrency
16, and sync handlers (chaos_app's "sleep") that log each start and finish in order.

The handlers' own log must never show more runs of one key at once than its limit, with and
without a worker and a dispatcher killed with -9 mid-run (the worker's runs are reclaimed, the
slot moving with them);
every run ends succeeded, the keys reach their limits (the slots are used), unkeyed jobs of the
same queue run while the keys are saturated, and no slot is left in flight at the end.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import cast

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import LOG
from support.fleet import (
    PARTITIONS,
    Fleet,
    Proc,
    events,
    run_state,
    schedule,
    started,
    wait_for,
)
from support.overlap import kill_mid_run, most_at_once

from rsched import Client, JobSpec
from rsched.core.ids import partition_for_key
from rsched.rdb import keys

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

SLEEP_S = 0.4
PER_KEY = 16
LIMITS = {"tenant-a": 2, "tenant-b": 2, "tenant-c": 2, "tenant-vip": 4}  # tenant-* and its own


def running_keyed(r: redis.Redis, key_of: dict[str, str]) -> str | None:
    """A worker (not the last one standing) that has a keyed run started and not finished."""
    open_runs: dict[str, set[str]] = defaultdict(set)
    for line in (x.decode() for x in cast(list[bytes], r.lrange(LOG, 0, -1))):
        run_id, _, worker, what = line.split()
        if run_id.rsplit("@", 1)[0] in key_of:
            (open_runs[worker].add if what == "start" else open_runs[worker].discard)(run_id)
    return next((w for w, runs in sorted(open_runs.items()) if runs), None)


def admission_ms(evts: list[dict[str, str]], key_of: dict[str, str]) -> list[int]:
    """For each run that waited (dispatched as its attempt 1 from the retry set, 'd'), the ms
    from the latest end of a run of its key before it (the slot it got) to its dispatch,
    sorted."""
    ends: dict[str, list[int]] = defaultdict(list)
    for e in evts:
        if e["e"] == "succeeded" and e.get("j") in key_of:
            ends[key_of[e["j"]]].append(int(e["t"]))
    out = []
    for e in evts:
        if e["e"] == "dispatched" and e.get("j") in key_of and e.get("a", "1") == "1":
            t = int(e["t"])
            before = [x for x in ends[key_of[e["j"]]] if x <= t]
            if before:
                out.append(t - max(before))
    return sorted(out)


def left_in_flight(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """Limit key -> (runs holding a slot, runs waiting), for keys with either."""
    out = {}
    for key in LIMITS:
        p = partition_for_key(key, PARTITIONS)
        held, waits = r.scard(keys.limit_running(p, key)), r.zcard(keys.limit_waiting(p, key))
        if held or waits:
            out[key] = (int(held), int(waits))
    return out


def start_fleet(r: redis.Redis, fleet: Fleet) -> dict[str, Proc]:
    """Two dispatchers and three workers at concurrency 16, started; the workers by name."""
    names = ["d1", "d2", "w1", "w2", "w3"]
    fleet.dispatcher("d1")
    fleet.dispatcher("d2")
    workers = {w: fleet.worker(w, concurrency=16) for w in names[2:]}
    wait_for(lambda: started(r, names), 60, "processes to start", fleet)
    return workers


def run_fleet_with_limits(r: redis.Redis, fleet: Fleet, client: Client, kill: bool) -> None:
    workers = start_fleet(r, fleet)
    client.set_limit("tenant-*", concurrency=2)
    client.set_limit("tenant-vip", concurrency=4)
    specs = [JobSpec("sleep", {"sleeps": [SLEEP_S]}, limit_key=key)
             for _ in range(PER_KEY) for key in LIMITS]
    specs += [JobSpec("sleep", {"sleeps": [0.05]}) for _ in range(16)]  # unkeyed, same queue
    jobs = schedule(client, specs)
    key_of = {j.id: j.limit_key for j in jobs if j.limit_key}
    unkeyed = [j for j in jobs if not j.limit_key]
    t0 = time.monotonic()
    if kill:
        # Mid-run: a worker running keyed runs is killed; d1 goes too (its partitions' waiting
        # runs are admitted by d2 once it takes them over).
        name = wait_for(lambda: running_keyed(r, key_of), 30, "keyed runs to start", fleet)
        kill_mid_run(r, fleet, workers[name], name)
    # Unkeyed jobs do not wait behind the saturated keys (their own ~0.05 s runs, at once).
    wait_for(lambda: all(run_state(r, f"{j.id}@{j.next_ms}").get("state") == "succeeded"
                         for j in unkeyed), 30, "the unkeyed jobs to finish", fleet)
    unkeyed_s = time.monotonic() - t0
    wait_for(lambda: all(run_state(r, f"{j.id}@{j.next_ms}").get("state") == "succeeded"
                         for j in jobs), 120, "every run to succeed", fleet)
    log = [x.decode() for x in cast(list[bytes], r.lrange(LOG, 0, -1))]
    most = most_at_once(log, key_of)
    for key, limit in LIMITS.items():
        assert most[key] <= limit, (key, most)
        assert most[key] == limit, (key, most)  # the limit is used, not undercut
    evts = events(r)
    if kill:  # w1's runs were reclaimed, their slots with them
        assert any(e["e"] == "reclaimed" and e.get("j") in key_of for e in evts)
    waits = admission_ms(evts, key_of)
    # Nothing is left holding or waiting for a slot once everything has ended.
    wait_for(lambda: not left_in_flight(r), 10, "no slot left in flight", fleet)
    print(f"limits fleet (kill={kill}): most at once {most}, unkeyed done in {unkeyed_s:.1f} s, "
          f"freed slot to next dispatch p50 {waits[len(waits) // 2]} ms, max {waits[-1]} ms")
    if kill:
        return  # the killed worker's unkeyed runs wait for their reclaim too
    # No polling: an ending wakes the dispatchers (a dispatcher asleep would take up to its
    # 1 s idle sleep).  The bound is what a loaded test machine needs, not the 100 ms target.
    assert waits and waits[len(waits) // 2] < 250, waits
    # Each key's 16 runs of 0.4 s take 3.2 s at 2 at once: the unkeyed ones, on the same queue
    # and workers, all finish before half of a saturated key's runs have started.
    unkeyed_ids = {j.id for j in unkeyed}
    last_unkeyed = max(i for i, line in enumerate(log)
                       if line.split()[0].rsplit("@", 1)[0] in unkeyed_ids)
    a_starts = [i for i, line in enumerate(log) if line.endswith(" start")
                and key_of.get(line.split()[0].rsplit("@", 1)[0]) == "tenant-a"]
    assert last_unkeyed < a_starts[PER_KEY // 2], (last_unkeyed, a_starts)


@pytest.mark.timeout(240)
def test_no_key_ever_runs_more_than_its_limit_across_two_dispatchers_and_three_workers(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    run_fleet_with_limits(r, fleet, client, kill=False)


@pytest.mark.timeout(240)
def test_no_key_runs_more_than_its_limit_when_a_worker_and_a_dispatcher_are_killed_mid_run(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    run_fleet_with_limits(r, fleet, client, kill=True)


RATE, PERIOD_S, BACKLOG = 5, 1, 60


@pytest.mark.timeout(240)
def test_a_rate_limit_never_lets_more_start_in_any_window_and_keeps_up_with_its_rate(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    """A sliding window on Redis's clock: at most 5 dispatches of the key in any 1 s (neither
    fixed buckets nor a bucket that lets 10 through around an edge); with a backlog of 60,
    at least 90% of the rate over 10 s."""
    start_fleet(r, fleet)
    client.set_limit("paid-api", rate=(RATE, PERIOD_S))
    jobs = schedule(client, [JobSpec("sleep", {"sleeps": [0.02]}, limit_key="paid-api")
                             for _ in range(BACKLOG)])
    wait_for(lambda: all(run_state(r, f"{j.id}@{j.next_ms}").get("state") == "succeeded"
                         for j in jobs), 60, "every run to succeed", fleet)
    ids = {j.id for j in jobs}
    at = sorted(int(e["t"]) for e in events(r) if e["e"] == "dispatched" and e.get("j") in ids)
    assert len(at) == BACKLOG  # each dispatched once: waiting spent no attempt
    window = PERIOD_S * 1000
    most = max(sum(1 for t in at[i:] if t < s + window) for i, s in enumerate(at))
    in_10s = sum(1 for t in at if t < at[0] + 10 * window)
    print(f"rate fleet: most in any {window} ms: {most}; in the first 10 s: {in_10s} "
          f"(rate {RATE * 10})")
    assert most <= RATE, [t - at[0] for t in at]
    assert in_10s >= 0.9 * RATE * 10, at
