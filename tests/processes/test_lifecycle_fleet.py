"""Lifecycle limits with real processes: two dispatchers and three workers (one dispatcher killed
with SIGKILL and replaced midway), counting what the handlers themselves log (chaos_app.LOG).

endAt and maxRuns give exact counts, pauseAfterFailures pauses after exactly N dead letters, and
a start deadline dead-letters a one-off job whose dispatch (dispatchers SIGSTOPped) or start
(workers SIGSTOPped) was held past it, without ever running it.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import cast

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import LOG
from support.fleet import Fleet, run_state, started, wait_for

from rsched import Client, JobSpec, JobStatus
from rsched.core.cron import parse_cron
from rsched.rdb import keys

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

NAMES = ["d1", "d2", "w1", "w2", "w3"]


def start_fleet(r: redis.Redis, fleet: Fleet) -> None:
    for name in NAMES:
        if name.startswith("d"):
            fleet.dispatcher(name)
        else:
            fleet.worker(name)
    wait_for(lambda: started(r, NAMES), 30, "processes to start", fleet)


def handler_starts(r: redis.Redis) -> Counter[str]:
    """Job id -> how many times its handler started (the handlers' own log)."""
    log = [x.decode() for x in cast(list[bytes], r.lrange(LOG, 0, -1))]
    return Counter(line.split()[0].rsplit("@", 1)[0] for line in log if line.endswith(" start"))


def dead_letters(r: redis.Redis, job_id: str) -> list[str]:
    p = int(job_id.split("-", 1)[0])
    return [m.decode() for m in cast(list[bytes], r.zrange(keys.dead(p), 0, -1))
            if m.decode().startswith(job_id + "@")]


@pytest.mark.timeout(150)
def test_end_at_and_max_runs_give_exact_counts_and_pause_after_failures_pauses_after_exactly_n(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    start_fleet(r, fleet)
    now = client.now_ms()
    end_at = now + 8_000
    jobs = client.schedule_many([
        JobSpec(type="record", cron="* * * * * *", max_runs=5),
        JobSpec(type="record", cron="* * * * * *", end_at=end_at),
        JobSpec(type="fail", cron="*/2 * * * * *", max_attempts=1, pause_after_failures=3),
    ])
    max_runs, ends, fails = (j for j in jobs if not isinstance(j, Exception))
    assert ends.next_ms is not None
    every_second = parse_cron("* * * * * *", "UTC")
    expected_end, at = 0, ends.next_ms
    while at <= end_at:  # the occurrences from the first to endAt, endAt's own included
        expected_end, at = expected_end + 1, every_second.next_after(at)
    time.sleep(3)
    fleet.procs["d1"].send(signal.SIGKILL)  # its partitions move to d2, then to d3 as well
    fleet.dispatcher("d3")

    def finished() -> bool:
        return (client.get(max_runs.id).status is JobStatus.COMPLETED
                and client.get(ends.id).status is JobStatus.COMPLETED
                and client.get(fails.id).status is JobStatus.PAUSED)

    wait_for(finished, 60, "both jobs to complete and the failing one to pause", fleet)
    time.sleep(3)  # anything dispatched late would have run by now
    starts = handler_starts(r)
    assert starts[max_runs.id] == 5
    assert client.get(max_runs.id).remaining_runs == 0
    assert starts[ends.id] == expected_end
    assert starts[fails.id] == 3 and len(dead_letters(r, fails.id)) == 3
    paused = client.get(fails.id)
    assert paused.paused is not None and paused.paused.by == "pauseAfterFailures"
    assert paused.paused.reason is not None and paused.paused.reason.startswith(
        "3 consecutive occurrences dead-lettered")


@pytest.mark.timeout(150)
def test_a_start_deadline_dead_letters_a_one_off_job_whose_dispatch_or_start_was_held_past_it(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    start_fleet(r, fleet)

    def held(names: list[str], what: str) -> tuple[str, str]:
        """SIGSTOP ``names`` while a job with a 2 s deadline and one with 60 s fall due, 4 s,
        then SIGCONT: (the late run's id, the other's)."""
        for n in names:
            fleet.procs[n].send(signal.SIGSTOP)
        now = client.now_ms()
        late, kept = (j for j in client.schedule_many([
            JobSpec(type="record", run_at=now + 500, start_deadline_ms=2_000),
            JobSpec(type="record", run_at=now + 500, start_deadline_ms=60_000),
        ]) if not isinstance(j, Exception))
        time.sleep(4)
        for n in names:
            fleet.procs[n].send(signal.SIGCONT)
        late_run, kept_run = (f"{j.id}@{j.next_ms}" for j in (late, kept))
        wait_for(lambda: run_state(r, late_run).get("state") == "dead", 30,
                 f"the late run to be dead-lettered ({what})", fleet)
        wait_for(lambda: run_state(r, kept_run).get("state") == "succeeded", 30,
                 f"the other to run ({what})", fleet)
        assert run_state(r, late_run)["error"] == "missed start deadline"
        return late_run, kept_run

    by_claim = held(["d1", "d2"], "dispatchers stopped")
    by_start = held(["w1", "w2", "w3"], "workers stopped")
    time.sleep(1)
    starts = handler_starts(r)
    for late_run, kept_run in (by_claim, by_start):
        assert starts[late_run.rsplit("@", 1)[0]] == 0  # never run, not even late
        assert starts[kept_run.rsplit("@", 1)[0]] == 1
        assert client.get(late_run.rsplit("@", 1)[0]).status is JobStatus.DEAD
