"""Chaos tests: real dispatcher and worker processes, real redis-server, real signals.

Each test starts `python -m rsched.cli dispatcher|worker` processes against a redis-server of
its own keyspace, schedules jobs whose handlers (tests/support/chaos_app.py) count every
execution by run id, injects a fault (SIGKILL, SIGSTOP/SIGCONT, SIGTERM, a Redis restart) and
then checks the invariants: every occurrence ran, none ran twice unless a fault forced a second
attempt, and the history says what happened.  Nothing sleeps a fixed time: every wait polls with
a deadline.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import FINISHES, STARTS
from support.fleet import (
    LEASE_MS,
    Fleet,
    balanced,
    counts,
    event_counts,
    events,
    leases,
    owned_by,
    quiet,
    report,
    run_in,
    run_state,
    schedule,
    started,
    wait_for,
)
from support.helpers import next_ms, next_run
from support.redis_server import RedisServer

from rsched import Client, JobSpec
from rsched.core.defaults import CATCH_UP_WINDOW_MS

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

fleets, fleet, client, closing = (  # fixtures, used by name
    fleet_support.fleets, fleet_support.fleet, fleet_support.client, fleet_support.closing)

# History events that only a fault (or a failing handler) produces.
FAULTS = (
    "fenced",
    "abandoned",
    "reclaimed",
    "failed",
    "timed_out",
    "retry_scheduled",
    "dead_lettered",
    "skipped",
)


# --- processes ---------------------------------------------------------------------------------














# --- waiting and reading -----------------------------------------------------------------------
























def dispatches(evts: list[dict[str, str]], job_id: str) -> list[tuple[int, int]]:
    """(scheduled ms, dispatched ms) of a job's occurrences, in schedule order."""
    return sorted(
        (int(e["s"]), int(e["t"])) for e in evts if e["e"] == "dispatched" and e["j"] == job_id
    )






def assert_every_second(job_id: str, occurrences: list[tuple[int, int]], at_least: int,
                        window_ms: int = CATCH_UP_WINDOW_MS) -> int:
    """A `* * * * * *` job's occurrences (scheduled, dispatched ms): whole seconds, in order, none
    missing unless the job's catch-up window explains it; returns how many it skipped so.

    After an outage every occurrence missed by at most the window runs, in order (core.catchup);
    an occurrence m between two dispatched ones s < m < n was rightly skipped only when the claim
    that moved past it, the one that dispatched n at t, came more than the window after it.
    """
    scheds = [s for s, _ in occurrences]
    assert len(scheds) >= at_least, (job_id, occurrences)
    assert all(s % 1000 == 0 for s in scheds), (job_id, occurrences)
    assert scheds == sorted(set(scheds)), (job_id, occurrences)
    missed = [(m, n, t) for (s, _), (n, t) in pairwise(occurrences)
              for m in range(s + 1000, n, 1000) if t - m <= window_ms]
    assert missed == [], (job_id, "occurrences inside the catch-up window missed", missed)
    return sum((n - s) // 1000 - 1 for (s, _), (n, _) in pairwise(occurrences))


def spread(evts: list[dict[str, str]], event: str) -> dict[str, int]:
    """p50, p99 and max of (event time - scheduled time) over events of one type; for "started",
    also the starts that outcome events carry ('st': a run started and finished in one report)."""
    lags = sorted([int(e["t"]) - int(e["s"]) for e in evts if e["e"] == event]
                  + [int(e["st"]) - int(e["s"]) for e in evts if event == "started" and "st" in e])
    return {"p50": lags[len(lags) // 2], "p99": lags[len(lags) * 99 // 100], "max": lags[-1]}




# --- tests -------------------------------------------------------------------------------------


def test_three_dispatchers_and_three_workers_run_every_occurrence_exactly_once(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    names = ["d1", "d2", "d3", "w1", "w2", "w3"]
    for name in names:
        (fleet.dispatcher if name.startswith("d") else fleet.worker)(name)
    wait_for(lambda: started(r, names), 30, "all six processes to start", fleet)
    wait_for(lambda: balanced(r, ["d1", "d2", "d3"]), 15, "16 partitions split 5/5/6", fleet)

    now = client.now_ms()
    one_offs = schedule(
        client, [JobSpec(type="record", run_at=now + 500 + i * 2) for i in range(2000)]
    )
    crons = schedule(client, [JobSpec(type="record", cron="* * * * * *") for _ in range(3)])
    one_off_runs = {next_run(j) for j in one_offs}

    def one_offs_done() -> bool:
        return set(counts(r, FINISHES)) >= one_off_runs

    wait_for(one_offs_done, 40, "2,000 one-off jobs to finish", fleet)
    # Let the every-second jobs fire a few times more than the one-offs took, then stop them.
    first_cron = min(next_ms(j) for j in crons)
    wait_for(lambda: client.now_ms() > first_cron + 4500, 10, "five cron seconds")
    for job in crons:
        client.pause(job.id)  # not cancel: that abandons a dispatched run not yet started
    wait_for(lambda: quiet(r), 20, "every dispatched run to finish", fleet)

    starts, finishes, log, evts = counts(r, STARTS), counts(r, FINISHES), events(r), event_counts(r)
    faults = {e: n for (e, _), n in evts.items() if e in FAULTS}
    assert faults == {}  # no handler failed, nothing was reclaimed, fenced or skipped
    dispatched = {rid for e, rid in evts if e == "dispatched"}
    assert one_off_runs <= dispatched
    assert [rid for rid in dispatched if evts["dispatched", rid] != 1] == []
    assert [rid for rid in dispatched if starts.get(rid) != 1 or finishes.get(rid) != 1] == []
    assert [rid for rid in dispatched if evts["succeeded", rid] != 1] == []
    assert set(starts) == dispatched  # nothing ran that was not dispatched
    skipped = 0
    for job in crons:
        occurrences = dispatches(log, job.id)
        skipped += assert_every_second(job.id, occurrences, at_least=5)
        assert occurrences[0][0] == job.next_ms  # the first occurrence was not skipped

    report(
        "fleet",
        t0,
        starts,
        runs=len(dispatched),
        cron_runs=len(dispatched) - len(one_off_runs),
        lost=len(dispatched - set(finishes)),
        cron_skipped_by_window=skipped,
        dispatch_lag_ms=spread(log, "dispatched"),
        start_lag_ms=spread(log, "started"),
    )


def test_a_run_whose_worker_is_killed_is_reclaimed_and_completes_on_another_worker(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    fleet.dispatcher("d1")
    workers = {"w1": fleet.worker("w1"), "w2": fleet.worker("w2")}
    wait_for(lambda: started(r, ["d1", "w1", "w2"]), 30, "processes to start", fleet)

    job = client.schedule("sleep", {"sleeps": [3]})
    rid = next_run(job)
    first = wait_for(lambda: run_in(r, rid, "running"), 15, "the run to start", fleet)
    victim = first["worker"]
    wait_for(lambda: counts(r, STARTS).get(rid), 5, "the handler to begin", fleet)
    workers[victim].send(signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = ({"w1", "w2"} - {victim}).pop()

    final = wait_for(lambda: run_in(r, rid, "succeeded"), 30, "the reclaimed run to succeed", fleet)
    assert final["worker"] == survivor
    assert final["attempt"] == "2"
    assert int(final["fence"]) > int(first["fence"])
    history = [(a.attempt, a.status, a.worker) for a in client.runs(job.id)]
    assert history == [(2, "succeeded", survivor), (1, "abandoned", victim)]
    assert counts(r, STARTS)[rid] == 2  # once per attempt
    assert counts(r, FINISHES)[rid] == 1  # the killed attempt never finished
    evts = event_counts(r)
    assert (evts["succeeded", rid], evts["abandoned", rid], evts["reclaimed", rid]) == (1, 1, 1)
    assert evts["fenced", rid] == 0
    report(
        "kill9",
        t0,
        counts(r, STARTS),
        reclaim_and_finish_s=round(time.monotonic() - killed_at, 1),
    )


def test_a_dispatcher_stopped_past_its_lease_loses_its_partitions_and_writes_nothing_after(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    d1, _ = fleet.dispatcher("d1"), fleet.dispatcher("d2")
    fleet.worker("w1")
    fleet.worker("w2")
    wait_for(lambda: started(r, ["d1", "d2", "w1", "w2"]), 30, "processes to start", fleet)
    wait_for(lambda: balanced(r, ["d1", "d2"]), 15, "partitions split 8/8", fleet)

    now = client.now_ms()
    one_offs = schedule(
        client, [JobSpec(type="record", run_at=now + 300 + i * 10) for i in range(800)]
    )
    crons = schedule(client, [JobSpec(type="record", cron="* * * * * *") for _ in range(2)])
    one_off_runs = {next_run(j) for j in one_offs}
    wait_for(lambda: len(counts(r, FINISHES)) >= 50, 15, "dispatch to be under way", fleet)

    before = leases(r)
    d1_parts = sorted(p for p, (owner, _) in before.items() if owner == "d1")
    d1.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    taken = wait_for(
        lambda: owned_by(r, d1_parts, "d2"), 15, "d2 to take over d1's partitions", fleet
    )
    taken_s = time.monotonic() - stopped_at
    assert all(taken[p][1] > before[p][1] for p in d1_parts)  # a new owner means a new fence
    # Let d2 dispatch on the taken partitions for a while before d1 wakes with its stale view.
    wait_for(lambda: time.monotonic() > stopped_at + 2.5 * LEASE_MS / 1000, 10, "a long stop")
    d1.send(signal.SIGCONT)
    continued_at = time.monotonic()
    wait_for(
        lambda: balanced(r, ["d1", "d2"]), 15, "d1 to rejoin and partitions to rebalance", fleet
    )
    rejoined_s = time.monotonic() - continued_at
    back = leases(r)
    back_parts = [p for p, (owner, _) in back.items() if owner == "d1"]
    assert all(back[p][1] > taken[p][1] for p in back_parts)  # d1 came back with new fences

    wait_for(lambda: set(counts(r, FINISHES)) >= one_off_runs, 30, "one-offs to finish", fleet)
    for job in crons:
        client.pause(job.id)  # not cancel: that abandons a dispatched run not yet started
    wait_for(lambda: quiet(r), 20, "every dispatched run to finish", fleet)

    starts, log, evts = counts(r, STARTS), events(r), event_counts(r)
    dispatched = {rid for e, rid in evts if e == "dispatched"}
    assert one_off_runs <= dispatched
    assert [rid for rid in dispatched if evts["dispatched", rid] != 1] == []
    assert [rid for rid in dispatched if starts.get(rid) != 1] == []
    # Occurrences due while d1 was stopped are late, and all run: d1 stops far less than the
    # catch-up window (60 s).
    skipped = sum(assert_every_second(j.id, dispatches(log, j.id), at_least=4) for j in crons)
    assert "lease lost" in d1.log.read_text() or "released or lost" in d1.log.read_text()
    report(
        "sigstop",
        t0,
        starts,
        runs=len(dispatched),
        d1_partitions=len(d1_parts),
        takeover_s=round(taken_s, 1),
        stopped_s=round(continued_at - stopped_at, 1),
        rejoin_s=round(rejoined_s, 1),
        cron_skipped_by_window=skipped,
        dispatch_lag_ms=spread(log, "dispatched"),
    )


def test_sigterm_lets_running_jobs_finish_within_the_grace_and_leaves_the_rest_to_others(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    t0 = time.monotonic()
    grace_s = 6.0
    fleet.dispatcher("d1")
    w1 = fleet.worker("w1", queues="drain", grace_s=grace_s)
    wait_for(lambda: started(r, ["d1", "w1"]), 30, "processes to start", fleet)

    # Runs longer than the visibility timeout but shorter than the grace: they must stay w1's.
    short = [client.schedule("sleep", {"sleeps": [3]}, queue="drain") for _ in range(3)]
    long = client.schedule("sleep", {"sleeps": [60, 0.2]}, queue="drain")
    runs = {j.id: next_run(j) for j in [*short, long]}

    def all_running() -> bool:
        return all(counts(r, STARTS).get(rid) for rid in runs.values())

    wait_for(all_running, 15, "four runs in progress on w1", fleet)
    w1.send(signal.SIGTERM)
    term_at = time.monotonic()
    # Once w1 drains (a read in flight at SIGTERM has returned), it must fetch nothing more.
    wait_for(lambda: "waiting up to" in w1.log.read_text(), 5, "w1 to start draining", fleet)
    late = client.schedule("record", queue="drain")
    late_run = next_run(late)
    fleet.worker("w2", queues="drain")

    w1.popen.wait(grace_s + 10)
    exit_s = time.monotonic() - term_at
    for job in short:
        s = run_state(r, runs[job.id])
        assert (s["state"], s["worker"], s["attempt"]) == ("succeeded", "w1", "1"), s
    long_run = runs[long.id]
    final = wait_for(
        lambda: run_in(r, long_run, "succeeded"),
        30,
        "the long run to be reclaimed and finish",
        fleet,
    )
    assert (final["worker"], final["attempt"]) == ("w2", "2")
    history = [(a.attempt, a.status, a.worker) for a in client.runs(long.id)]
    assert history == [(2, "succeeded", "w2"), (1, "abandoned", "w1")]
    wait_for(lambda: run_state(r, late_run).get("state") == "succeeded", 15, "the late job", fleet)
    assert run_state(r, late_run)["worker"] == "w2"

    starts, finishes, evts = counts(r, STARTS), counts(r, FINISHES), event_counts(r)
    assert [starts[runs[j.id]] for j in short] == [1, 1, 1]
    assert [finishes[runs[j.id]] for j in short] == [1, 1, 1]
    assert (starts[long_run], finishes.get(long_run)) == (2, 1)  # w1's attempt was cut off
    assert sum(n for (e, _), n in evts.items() if e == "fenced") == 0
    assert w1.popen.returncode == 0
    report(
        "sigterm",
        t0,
        starts,
        worker_exit_s=round(exit_s, 1),
        grace_s=grace_s,
    )


def test_dispatcher_and_worker_ride_through_a_redis_restart_and_lose_nothing(
    aof_redis: RedisServer,
    fleets: Callable[..., Fleet],
    closing: Callable[[Any], Any],
) -> None:
    t0 = time.monotonic()
    r = closing(redis.Redis.from_url(aof_redis.url))
    fleet = fleets(aof_redis.url, unsafe=False)
    fleet.dispatcher("d1")
    fleet.worker("w1")
    wait_for(lambda: started(r, ["d1", "w1"]), 30, "processes to start", fleet)

    client = closing(Client(aof_redis.url))
    now = client.now_ms()
    specs = [
        JobSpec(type="record", run_at=now + 300 + i * 20, backoff_base_ms=100) for i in range(300)
    ]
    one_offs = schedule(client, specs)
    cron = schedule(client, [JobSpec(type="record", cron="* * * * * *", backoff_base_ms=100)])[0]
    one_off_runs = {next_run(j) for j in one_offs}
    wait_for(lambda: len(counts(r, FINISHES)) >= 40, 15, "runs to be under way", fleet)

    down_at = time.monotonic()
    aof_redis.stop()  # SIGTERM: Redis writes its AOF out; its script cache is not kept
    wait_for(
        lambda: (
            "fetch: " in fleet.procs["w1"].log.read_text()
            and "wake listener: " in fleet.procs["d1"].log.read_text()
        ),
        15,
        "both processes to notice that Redis is gone",
        fleet,
    )
    aof_redis.restart()
    down_s = time.monotonic() - down_at

    wait_for(
        lambda: set(counts(r, FINISHES)) >= one_off_runs,
        40,
        "every job scheduled before the restart to run",
        fleet,
    )
    # The cron job keeps firing after the restart: the dispatcher reloaded its scripts.
    resumed = client.now_ms()
    wait_for(
        lambda: any(s > resumed for s, _ in dispatches(events(r), cron.id)),
        10,
        "a cron occurrence after the restart",
        fleet,
    )
    # Counters since the restart, before this test's client ran any script: the processes got
    # NOSCRIPT and loaded the scripts again.
    assert r.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0) >= 1
    assert r.info("commandstats")["cmdstat_script|load"]["calls"] >= 1
    client.pause(cron.id)
    wait_for(lambda: quiet(r), 20, "every dispatched run to finish", fleet)
    assert all(p.alive() for p in fleet.procs.values())

    starts, evts = counts(r, STARTS), event_counts(r)
    dispatched = {rid for e, rid in evts if e == "dispatched"}
    assert one_off_runs <= dispatched
    assert [rid for rid in dispatched if evts["succeeded", rid] != 1] == []
    skipped = assert_every_second(cron.id, dispatches(events(r), cron.id), at_least=2)
    report(
        "redis_restart",
        t0,
        starts,
        runs=len(dispatched),
        down_s=round(down_s, 2),
        lost=len(one_off_runs - set(counts(r, FINISHES))),
        cron_skipped_by_window=skipped,
        retried=sum(n for (e, _), n in evts.items() if e == "retry_scheduled"),
    )
