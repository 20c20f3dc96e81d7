"""Workers with different handlers on one queue: real redis-server, real dispatcher and worker
processes, the real CLI.

A worker that reads a run of a type it has no handler for sets it aside unrun (no attempt
spent) for a worker that has the handler; a run whose type no live worker serves waits,
flagged by `rsched status`, and is dead-lettered for that reason only after the handler wait.
Before, the worker that read it ran it: UnknownJobType spent an attempt and dead-lettered the
job once its attempts were used up, whichever worker had the handler.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from support import fleet as fleet_support
from support.fleet import Fleet, Proc, events, started, wait_for

from rsched import Client, Job
from rsched.rdb import keys

pytestmark = [pytest.mark.slow]
fleets = fleet_support.fleets  # fixture, used by name


def spawn_worker(fleet: Fleet, name: str, app: str, *extra: str) -> Proc:
    return fleet._spawn(name, ["worker", "--app", f"support.shared_queue_apps:{app}",
                               "--concurrency", "4", "--visibility-ms", "4000",
                               "--heartbeat-ms", "1000", "--grace", "1", *extra])


def cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsched.cli", "--redis-url", redis_url, *args],
                          capture_output=True, text=True, timeout=60, check=True)


def waiting(redis_url: str) -> list[dict[str, Any]]:
    """`rsched status --json`'s runs waiting for a handler."""
    return list(json.loads(cli(redis_url, "status", "--json").stdout)["waitingForHandler"])


def run_of(client: Client, job: Job) -> Any:
    """A one-off job's run, once dispatched (its last run)."""
    rid = client.get(job.id).last_run_id
    assert rid is not None, f"{job.id} not dispatched yet"
    return client.get_run(rid)


def all_succeeded(client: Client, jobs: list[Job]) -> Callable[[], bool]:
    return lambda: all(client.get(j.id).status.value == "completed" for j in jobs)


def test_each_worker_runs_only_the_types_it_has_handlers_for_and_spends_no_attempt_on_others(
    r: redis.Redis, fleets: Callable[..., Fleet], client: Client, redis_url: str
) -> None:
    fleet = fleets(redis_url)
    fleet.dispatcher("d1")
    spawn_worker(fleet, "wb", "beta")
    wait_for(lambda: started(r, ["d1", "wb"]), 30, "the dispatcher and worker B to start", fleet)

    # Only B runs: the alpha and flaky runs it reads wait, set aside and flagged.
    alphas: list[Job] = [client.schedule("alpha") for _ in range(8)]
    flakies: list[Job] = [client.schedule("flaky", max_attempts=2, backoff_base_ms=0)
                          for _ in range(4)]
    betas: list[Job] = [client.schedule("beta") for _ in range(8)]
    wait_for(all_succeeded(client, betas), 30, "B to run the beta jobs", fleet)
    expected = [{"queue": "default", "type": "alpha", "runs": 8, "served": False},
                {"queue": "default", "type": "flaky", "runs": 4, "served": False}]
    wait_for(lambda: waiting(redis_url) == expected, 30, "the other runs to be set aside", fleet)
    for job in alphas + flakies:
        run = run_of(client, job)
        assert (run.state.value, run.attempt) == ("dispatched", 1)
    text = cli(redis_url, "status").stdout
    assert "WAITING FOR A HANDLER: type alpha on queue default (8 runs)" in text
    added = cli(redis_url, "jobs", "add", "--type", "alpha")
    assert ("no live worker has a handler for job type 'alpha' on queue 'default'; the workers "
            "reading it set its runs aside unrun, and each run is dead-lettered if none with "
            "that handler serves the queue within 600 s") in added.stderr
    alphas.append(client.get(added.stdout.strip()))

    # A starts: it takes what B set aside, and from now on both read the queue.
    spawn_worker(fleet, "wa", "alpha")
    more: list[Job] = [client.schedule(t) for _ in range(20) for t in ("alpha", "beta")]
    everything = alphas + flakies + betas + more
    wait_for(all_succeeded(client, everything), 60, "every job to succeed", fleet)

    for job in everything:
        run = run_of(client, job)
        want = ("wb" if job.type == "beta" else "wa", 2 if job.type == "flaky" else 1)
        assert (run.worker, run.attempt) == want, (job.type, run)
        assert run.result == want[0]
    for job in flakies:
        first = [a for a in client.runs(job.id) if a.attempt == 1]
        assert [(a.status, a.worker) for a in first] == [("failed", "wa")]
        assert "flaky: the first attempt fails" in (first[0].error or "")
    assert client.dead_letters() == []
    evs = events(r)
    assert not [e for e in evs if "UnknownJobType" in e.get("err", "")]
    assert not [e for e in evs if e["e"] in ("abandoned", "reclaimed", "fenced")]
    parked = {tuple(json.loads(k)): int(v) for k, v in r.hgetall(keys.parked()).items()}
    assert parked[("default", "alpha")] >= 9 and parked[("default", "flaky")] >= 4
    wait_for(lambda: waiting(redis_url) == [], 10, "nothing to wait for a handler", fleet)


def test_a_type_no_live_worker_serves_waits_visibly_then_is_dead_lettered_after_the_wait(
    r: redis.Redis, fleets: Callable[..., Fleet], client: Client, redis_url: str
) -> None:
    fleet = fleets(redis_url)
    fleet.dispatcher("d1")
    spawn_worker(fleet, "wb", "beta", "--handler-wait", "3")
    wait_for(lambda: started(r, ["d1", "wb"]), 30, "the dispatcher and worker B to start", fleet)

    t0 = time.time()
    jobs: list[Job] = [client.schedule("gamma", max_attempts=1) for _ in range(2)]
    added = cli(redis_url, "jobs", "add", "--type", "gamma")
    assert "dead-lettered if none with that handler serves the queue within 3 s" in added.stderr
    jobs.append(client.get(added.stdout.strip()))
    wait_for(lambda: waiting(redis_url) == [
        {"queue": "default", "type": "gamma", "runs": 3, "served": False}], 30,
        "the gamma runs to be set aside", fleet)
    if time.time() - t0 < 2.5:  # still within the wait (unless the machine was very slow)
        assert [run_of(client, j).state.value for j in jobs] == ["dispatched"] * 3

    wait_for(lambda: len(client.dead_letters()) == 3, 60, "the gamma runs to be dead-lettered",
             fleet)
    for d in client.dead_letters():
        assert d.error == "no live worker serves type gamma on queue default for 3 s"
        assert d.attempt == 1
        run = client.get_run(d.id)
        assert run.ended_ms is not None and run.dispatched_ms is not None
        assert run.ended_ms - run.dispatched_ms >= 3000  # never before the wait
    assert not [e for e in events(r) if e["e"] == "started"
                and e.get("ty", "") == "gamma"]
    assert waiting(redis_url) == []
