"""Recovery with the default settings: real processes, real signals, no shortened lease,
visibility or dead-after (docs/guarantees.md, "Recovery").

- A dispatcher killed with SIGKILL: each of its partitions starts its next due job within 3 s
  of the kill (the 2 s lease, renewed every 0.5 s, taken over at its expiry).
- A worker killed with SIGKILL, or frozen with SIGSTOP, with 16 runs in flight: each run starts
  again on another worker within 5 s (3 s of missed process heartbeats, then a beat of the
  taker); the survivors' runs, longer than 60 s, are never taken from them.
- The frozen worker, continued after 10 s, stops the handlers of the runs taken over and writes
  nothing for them: the takers' attempts are the ones recorded.

Every bound is measured by Redis's clock from the signal, and is the guarantee's, not what a
quiet machine shows.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import FINISHES, LOG, STARTS
from support.fleet import (
    Fleet,
    Proc,
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
from rsched.core.wire import as_text

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

DISPATCHER_BOUND_MS = 3000  # a killed dispatcher's partitions start their next job within this
WORKER_BOUND_MS = 5000  # a dead or frozen worker's runs start again elsewhere within this
RATE = int(os.environ.get("RSCHED_RECOVERY_RATE", "200"))  # jobs/s while a dispatcher is killed
KILLS = int(os.environ.get("RSCHED_RECOVERY_KILLS", "2"))  # more for the figures in the docs
IN_FLIGHT = 16  # runs of the worker that dies
LONG_S = 62  # the survivors' runs: longer than 60 s, never taken from a live worker


def default_dispatcher(fleet: Fleet, name: str) -> Proc:
    return fleet._spawn(name, ["dispatcher"])


def default_worker(fleet: Fleet, name: str, concurrency: int) -> Proc:
    return fleet._spawn(name, ["worker", "--app", "support.chaos_app:app",
                               "--concurrency", str(concurrency)])


def first_starts_after(evts: list[dict[str, str]], parts: set[int], since_ms: int
                       ) -> dict[int, int]:
    """Partition -> the first start of a run of it due at or after ``since_ms``."""
    first: dict[int, int] = {}
    for e in evts:
        start = e.get("t") if e["e"] == "started" else e.get("st")
        if not start or e["e"] not in ("started", "succeeded"):
            continue
        p = int(e["r"].split("-", 1)[0])
        if p in parts and int(e["s"]) >= since_ms:
            first[p] = min(first.get(p, int(start)), int(start))
    return first


def wait_balanced(r: redis.Redis, names: list[str], fleet: Fleet) -> None:
    wait_for(lambda: balanced(r, names), 20, "partitions split evenly", fleet)


def wait_until(client: Client, t_ms: int, what: str) -> None:
    """Until Redis's clock passes ``t_ms``."""
    wait_for(lambda: client.now_ms() > t_ms, (t_ms - client.now_ms()) / 1000 + 10, what)


def p50_max(xs: list[int]) -> dict[str, int]:
    xs = sorted(xs)
    return {"n": len(xs), "p50": xs[len(xs) // 2], "max": xs[-1]}


def test_a_killed_dispatchers_partitions_start_their_next_due_job_within_3_s_with_the_defaults(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    victim = default_dispatcher(fleet, "d-0")
    default_dispatcher(fleet, "d1")
    default_worker(fleet, "w1", 64)
    wait_for(lambda: started(r, ["d-0", "d1", "w1"]), 30, "processes to start", fleet)
    wait_for(lambda: balanced(r, ["d-0", "d1"]), 15, "partitions split 8/8", fleet)

    seconds = 4 + 6 * KILLS
    begin = client.now_ms() + 1000
    jobs = schedule(client, [  # keyed: spread evenly over the partitions
        JobSpec(type="record", run_at=begin + i * 1000 // RATE, idempotency_key=f"k{i}")
        for i in range(RATE * seconds)
    ])
    runs = {next_run(j) for j in jobs}
    after_kill: list[int] = []
    for k in range(KILLS):
        name = f"d-{k}"
        wait_balanced(r, [name, "d1"], fleet)
        wait_until(client, begin + 2000 + 6000 * k, "load before the kill")
        parts = {p for p, (owner, _) in leases(r).items() if owner == name}
        victim.send(signal.SIGKILL)
        killed_ms = client.now_ms()
        wait_until(client, killed_ms + DISPATCHER_BOUND_MS + 500, "the bound to pass")
        first = first_starts_after(events(r), parts, killed_ms)
        assert set(first) == parts, f"kill {k}: partitions with no start since: "\
            f"{sorted(parts - set(first))}"
        after_kill += [ms - killed_ms for ms in first.values()]
        victim = default_dispatcher(fleet, f"d-{k + 1}")  # the replacement, under a new id

    wait_for(lambda: set(counts(r, FINISHES)) >= runs, 60, "every job to finish", fleet)
    figures = p50_max(after_kill)
    report("dispatcher_kill_defaults", t0, counts(r, STARTS), rate=RATE, kills=KILLS,
           killed_partitions_first_start_after_kill_ms=figures)
    assert figures["max"] <= DISPATCHER_BOUND_MS, figures


def in_flight_on(r: redis.Redis, worker: str) -> dict[str, int]:
    """Run id -> attempt of the executions chaos_app logged as started by ``worker`` and not
    finished."""
    running: dict[str, int] = {}
    for line in r.lrange(LOG, 0, -1):
        rid, attempt, wid, what = as_text(line).split()
        if wid == worker and what == "start":
            running[rid] = int(attempt)
        elif wid == worker:
            running.pop(rid, None)
    return running


def restarts(r: redis.Redis, rids: set[str]) -> dict[str, tuple[int, str]]:
    """Run id -> (Redis time its attempt 2 started, by whom) for those of ``rids`` started
    again."""
    out = {}
    for e in events(r):
        if e["e"] == "started" and e["r"] in rids and e.get("a") == "2":
            out[e["r"]] = (int(e["t"]), e["w"])
    return out


def run_three_workers(r: redis.Redis, fleet: Fleet, client: Client, victim_sleeps: list[float]
                      ) -> tuple[Proc, set[str], set[str]]:
    """A dispatcher and three default workers; the victim runs IN_FLIGHT runs (sleeping
    ``victim_sleeps`` by attempt), the two others LONG_S-second runs with room to spare."""
    default_dispatcher(fleet, "d1")
    victim = default_worker(fleet, "wv", IN_FLIGHT)
    wait_for(lambda: started(r, ["d1", "wv"]), 30, "the dispatcher and the victim", fleet)
    theirs = {next_run(j) for j in schedule(client, [
        JobSpec(type="sleep", payload={"sleeps": victim_sleeps}, max_attempts=3)
        for _ in range(IN_FLIGHT)])}
    wait_for(lambda: set(in_flight_on(r, "wv")) == theirs, 30, "the victim's runs", fleet)
    for name in ("w1", "w2"):
        default_worker(fleet, name, 2 * IN_FLIGHT)
    wait_for(lambda: started(r, ["w1", "w2"]), 30, "the other workers", fleet)
    long_runs = {next_run(j) for j in schedule(client, [
        JobSpec(type="sleep", payload={"sleeps": [LONG_S]}, max_attempts=3)
        for _ in range(IN_FLIGHT)])}
    wait_for(lambda: set(in_flight_on(r, "w1")) | set(in_flight_on(r, "w2")) == long_runs, 30,
             "the other workers' long runs", fleet)
    return victim, theirs, long_runs


def check_taken_over_within_bound(r: redis.Redis, fleet: Fleet, theirs: set[str],
                                  since_ms: int) -> list[int]:
    def all_again() -> dict[str, tuple[int, str]] | None:
        got = restarts(r, theirs)
        return got if set(got) == theirs else None

    again = wait_for(all_again, WORKER_BOUND_MS / 1000 + 20, "every run to start again", fleet)
    lags = [t - since_ms for t, _ in again.values()]
    assert {w for _, w in again.values()} <= {"w1", "w2"}
    assert max(lags) <= WORKER_BOUND_MS, p50_max(lags)
    return lags


def test_a_killed_workers_runs_start_again_within_5_s_and_long_runs_of_live_workers_stay_theirs(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    victim, theirs, long_runs = run_three_workers(r, fleet, client, [LONG_S, 1])
    victim.send(signal.SIGKILL)
    killed_ms = client.now_ms()
    lags = check_taken_over_within_bound(r, fleet, theirs, killed_ms)

    wait_for(lambda: set(counts(r, FINISHES)) >= theirs | long_runs, LONG_S + 30,
             "every run to finish", fleet)
    starts = counts(r, STARTS)
    assert all(starts[rid] == 1 for rid in long_runs)  # never taken from a live worker
    assert all(starts[rid] == 2 for rid in theirs)
    evts = events(r)
    assert not [e for e in evts if e["e"] in ("abandoned", "fenced") and e["r"] in long_runs]
    report("worker_kill_defaults", t0, starts, in_flight=IN_FLIGHT,
           start_again_after_kill_ms=p50_max(lags))


def test_a_frozen_workers_runs_start_again_within_5_s_and_when_it_wakes_it_writes_nothing(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    # The takers' attempts outlast the freeze: it wakes to find them live under new fences.
    victim, theirs, _ = run_three_workers(r, fleet, client, [LONG_S, 15])
    victim.send(signal.SIGSTOP)
    stopped_ms = client.now_ms()
    lags = check_taken_over_within_bound(r, fleet, theirs, stopped_ms)
    wait_until(client, stopped_ms + 10_000, "10 s of the freeze")
    taken = {rid: run_state_of(r, rid) for rid in theirs}
    victim.send(signal.SIGCONT)
    continued_ms = client.now_ms()

    # Its handlers see ctx.cancelled and return (not LONG_S later); their outcomes are dropped.
    wait_for(lambda: not in_flight_on(r, "wv"), 15, "the victim's handlers to stop", fleet)
    wait_for(lambda: all(counts(r, FINISHES).get(rid) == 2 for rid in theirs), 30,
             "the takers' attempts to finish", fleet)
    evts = events(r)
    by_run: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for e in evts:
        if e.get("r") in theirs:
            by_run[e["r"]].append((e["e"], e.get("w", "")))
    for rid in theirs:
        assert ("succeeded", "wv") not in by_run[rid], by_run[rid]
        assert not [e for e in evts if e.get("r") == rid and e.get("w") == "wv"
                    and e["e"] in ("progress", "started", "failed", "retried")
                    and int(e.get("t", 0)) >= continued_ms]
        final = run_state_of(r, rid)
        assert (final["state"], final["attempt"]) == ("succeeded", "2")
        assert final["worker"] == taken[rid]["worker"] != "wv"
        assert [(a.attempt, a.status) for a in client.runs(rid.rsplit("@", 1)[0])] == [
            (2, "succeeded"), (1, "abandoned")]
    assert "outcome will not be recorded" in victim.log.read_text()
    assert victim.alive()
    report("worker_sigstop_defaults", t0, counts(r, STARTS), in_flight=IN_FLIGHT,
           start_again_after_stop_ms=p50_max(lags))


def run_state_of(r: redis.Redis, rid: str) -> dict[str, str]:
    return fleet_support.run_state(r, rid)
