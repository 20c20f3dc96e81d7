"""Overlap policies with real processes: two dispatchers, three workers, and a handler (sync,
chaos_app's "sleep") three times slower than its job's period.

The handlers' own log (chaos_app.LOG, one line per start and finish, in order) must never show two
runs of a skip, bufferOne or cancelPrevious job at once, while allow does overlap; every
occurrence is either run or recorded as a skipped run, never both, and the counts match the
policy.  Under cancelPrevious each next occurrence stops the running one (the handler returns once
``ctx.cancelled``), which is recorded 'cancelled', and starts once it has stopped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import cast

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import LOG
from support.fleet import Fleet, events, quiet, started, wait_for

from rsched import Client, JobSpec

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, fleet, client = fleet_support.fleets, fleet_support.fleet, fleet_support.client  # fixtures

SLEEP_S = 2.5  # each run; the jobs fire every second
RUN_S = 14


def most_at_once(log: list[str]) -> dict[str, int]:
    """Job id -> the most runs of it that were between their start and finish at once."""
    now: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    for line in log:
        run_id, _, _, what = line.split()
        job_id = run_id.rsplit("@", 1)[0]
        now[job_id] += 1 if what == "start" else -1
        most[job_id] = max(most[job_id], now[job_id])
    return dict(most)


@pytest.mark.timeout(150)
def test_skip_buffer_one_and_cancel_previous_never_run_two_occurrences_at_once_and_allow_does(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    names = ["d1", "d2", "w1", "w2", "w3"]
    fleet.dispatcher("d1")
    fleet.dispatcher("d2")
    for w in names[2:]:
        fleet.worker(w)
    wait_for(lambda: started(r, names), 30, "processes to start", fleet)
    results = client.schedule_many([
        JobSpec(type="sleep", payload={"sleeps": [SLEEP_S]}, cron="* * * * * *", overlap=o)
        for o in ("allow", "skip", "bufferOne", "cancelPrevious")
    ])
    allow, skip, buffer_one, cancel = (j for j in results if not isinstance(j, Exception))
    time.sleep(RUN_S)
    for j in (allow, skip, buffer_one, cancel):
        client.pause(j.id)
    wait_for(lambda: quiet(r), 30, "every dispatched run to finish", fleet)
    time.sleep(1)  # a buffered run let go by the last finish is dispatched within a round
    wait_for(lambda: quiet(r), 30, "the last buffered run to finish", fleet)

    log = [x.decode() for x in cast(list[bytes], r.lrange(LOG, 0, -1))]
    most, evts = most_at_once(log), events(r)
    assert most[allow.id] >= 2, most  # a slow handler overlaps itself under allow
    assert most[skip.id] == 1 and most[buffer_one.id] == 1 and most[cancel.id] == 1, most
    starts = {j.id: sum(1 for x in log if x.startswith(j.id + "@") and x.endswith(" start"))
              for j in (allow, skip, buffer_one, cancel)}
    for j in (skip, buffer_one, cancel):
        ran = {int(e["s"]) for e in evts if e["e"] == "dispatched" and e.get("j") == j.id}
        skipped = [e for e in evts if e["e"] == "skipped" and e.get("j") == j.id]
        not_run = {int(e["s"]) for e in skipped}
        assert len(not_run) == len(skipped) and not ran & not_run  # each once, run or not
        assert ran | not_run == set(range(min(ran), max(ran | not_run) + 1, 1000)), j.overlap
        assert all(e["err"].startswith("overlap: run ") for e in skipped)
        assert starts[j.id] == len(ran)
        if j is cancel:  # each stop takes well under the period: nothing needs skipping
            continue
        state = client.run(client.op_read_runs([f"{j.id}@{min(not_run)}"]))[0]
        assert state is not None and state.state.value == "skipped" and state.error
    # A run takes 2.5 s: skip starts one about every 3 s (the next whole second after a finish),
    # bufferOne one right after each finish (the buffered one), so it starts at least as many;
    # allow starts every occurrence.  Bounds generous for a busy machine.
    assert starts[allow.id] >= RUN_S - 4
    assert 2 <= starts[skip.id] <= RUN_S // 2
    assert starts[skip.id] <= starts[buffer_one.id] <= RUN_S // 2 + 2
    buffered = [e for e in evts if e["e"] == "dispatched" and e.get("j") == buffer_one.id
                and int(e["t"]) - int(e["s"]) > 1000]
    assert buffered, "no occurrence of the bufferOne job waited for its predecessor"
    # cancelPrevious: each run but the last is stopped by the next occurrence, long before its
    # 2.5 s are up: more start than under bufferOne, and the stops are recorded.
    stopped = [e for e in evts if e["e"] == "cancelled" and e["r"].startswith(cancel.id + "@")]
    assert len(stopped) >= starts[cancel.id] - 2 >= 3, (len(stopped), starts[cancel.id])
    assert all(e["err"].startswith("cancelled: overlap cancelPrevious") for e in stopped)
    assert starts[cancel.id] > starts[buffer_one.id]
    # Stop latency: from the occurrence that asked (the next one, one period later) to the
    # recorded stop; the heartbeat (300 ms here) tells the worker.
    waits = sorted(int(e["t"]) - (int(e["r"].rsplit("@", 1)[1]) + 1000) for e in stopped)
    print(f"cancelPrevious: {len(stopped)} stops, latency p50 {waits[len(waits) // 2]} ms, "
          f"max {waits[-1]} ms")
    assert waits[-1] < 2500, waits
