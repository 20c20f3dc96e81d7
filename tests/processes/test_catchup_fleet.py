"""The catch-up window with real processes: every dispatcher stopped for 30 s, then replaced.

Two dispatchers and three workers run jobs every 5 s.  With a 60 s window every occurrence missed
during the stop runs once after the restart, in order, each under its nominal time; with a 10 s
window the occurrences older than the window are recorded once, as one gap, and none of them
runs (misfire=skip) or only the latest does (run_once).
"""

from __future__ import annotations

import signal
import time

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import STARTS
from support.fleet import Fleet, counts, events, quiet, started, wait_for

from rsched import Client, JobSpec

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

LEASE_MS = 3000
PERIOD_MS = 5000
STOP_S = 30


def occurrences(evts: list[dict[str, str]], job_id: str, event: str) -> list[int]:
    """Scheduled ms of a job's events of one type, in the order they were recorded."""
    return [int(e["s"]) for e in evts if e["e"] == event and e.get("j") == job_id]


@pytest.mark.timeout(180)
def test_a_thirty_second_outage_runs_what_the_window_covers_and_records_the_rest_once(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    names = ["d1", "d2", "w1", "w2", "w3"]
    d1, d2 = fleet.dispatcher("d1", LEASE_MS), fleet.dispatcher("d2", LEASE_MS)
    for w in names[2:]:
        fleet.worker(w)
    wait_for(lambda: started(r, names), 30, "processes to start", fleet)
    every_5s = "*/5 * * * * *"
    wide, skip, once = client.schedule_many([
        JobSpec(type="record", cron=every_5s, catch_up_window_ms=60_000),
        JobSpec(type="record", cron=every_5s, catch_up_window_ms=10_000, misfire="skip"),
        JobSpec(type="record", cron=every_5s, catch_up_window_ms=10_000),
    ])
    assert not isinstance(wide, Exception) and not isinstance(skip, Exception)
    assert not isinstance(once, Exception)
    jobs = (wide, skip, once)
    wait_for(lambda: all(len(occurrences(events(r), j.id, "dispatched")) >= 2 for j in jobs), 20,
             "two occurrences of each job", fleet)

    for d in (d1, d2):
        d.send(signal.SIGKILL)
    stopped_ms = client.now_ms()
    time.sleep(STOP_S)
    restart_ms = client.now_ms()
    fleet.dispatcher("d3", LEASE_MS)
    fleet.dispatcher("d4", LEASE_MS)
    # Past the restart by two periods: the catch-up is over and the schedule runs on time again.
    caught_up = restart_ms + LEASE_MS + 2 * PERIOD_MS
    wait_for(lambda: all(max(occurrences(events(r), j.id, "dispatched")) > caught_up
                         for j in jobs), 40, "occurrences after the restart", fleet)
    for j in jobs:
        client.pause(j.id)
    wait_for(lambda: quiet(r), 20, "every dispatched run to finish", fleet)

    evts, starts = events(r), counts(r, STARTS)
    missed = list(range(stopped_ms - stopped_ms % PERIOD_MS + PERIOD_MS, restart_ms, PERIOD_MS))
    assert len(missed) >= STOP_S * 1000 // PERIOD_MS - 1
    for j in jobs:
        ran = occurrences(evts, j.id, "dispatched")
        assert ran == sorted(set(ran)), (j.id, ran)  # each once, in order
        assert all(starts.get(f"{j.id}@{t}") == 1 for t in ran), (j.id, ran, starts)
        assert all(t % PERIOD_MS == 0 for t in ran)
        skipped = [e for e in evts if e["e"] == "skipped" and e.get("j") == j.id]
        gap = client.get(j.id).last_gap
        slots = set(range(ran[0], ran[-1] + 1, PERIOD_MS))
        if j is wide:
            assert set(ran) == slots, ("an occurrence inside the window is missing", j.id)
            assert set(missed) <= set(ran) and skipped == [] and gap is None
            continue
        assert len(skipped) == 1 and gap is not None and gap.exact, (j.id, skipped, gap)
        in_gap = set(range(gap.first_ms, gap.last_ms + 1, PERIOD_MS))
        assert len(in_gap) == gap.size and in_gap <= set(missed)
        assert int(skipped[0]["s"]) == gap.first_ms
        assert not in_gap & set(ran)  # nothing of the gap ran...
        assert set(ran) | in_gap == slots  # ...and everything else did
        late = [t for t in missed if t not in in_gap]
        assert late and all(t in ran for t in late)
        if j is once:  # the latest occurrence older than the window ran once, right after it
            assert gap.last_ms + PERIOD_MS in ran
        else:
            assert min(late) >= restart_ms - 10_000 - 2 * PERIOD_MS
