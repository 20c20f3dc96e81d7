"""A stale worker cannot take back a run another worker reclaimed: real processes, real signals,
a real frozen connection.

Worker A runs a fresh entry at once and records its start later (its start loop after
--start-after-ms, or its next heartbeat).  A stalls in that window (SIGSTOP, or its Redis
connection freezes in a proxy), worker B reclaims the run after the visibility timeout and runs
attempt 2.  When A resumes, its start of the entry it read before the stall must be rejected
(fenced), so that B's attempt stays live and is the one recorded: before the fix A's start took
the run back, recorded B's live attempt as abandoned and, with max_attempts=2, dead-lettered an
occurrence whose both handlers succeeded.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis
from support import fleet as fleet_support
from support.chaos_app import FINISHES, STARTS
from support.fleet import Fleet, Proc, counts, events, run_in, run_state, started, wait_for
from support.helpers import next_run
from support.tcp_proxy import TcpProxy

from rsched import Client, Job
from rsched.rdb import keys

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, closing = fleet_support.fleets, fleet_support.closing  # fixtures, used by name


@dataclass
class Timing:
    visibility_ms: int
    heartbeat_ms: int
    start_after_ms: int


# The start loop is quicker than the heartbeat, or (start-after 60 s) only heartbeats record starts.
START_LOOP = Timing(visibility_ms=6000, heartbeat_ms=3000, start_after_ms=1000)
HEARTBEAT_ONLY = Timing(visibility_ms=3000, heartbeat_ms=1000, start_after_ms=60_000)


def spawn_worker(fleet: Fleet, name: str, t: Timing) -> Proc:
    return fleet._spawn(name, [
        "worker", "--app", "support.chaos_app:app", "--concurrency", "4",
        "--visibility-ms", str(t.visibility_ms), "--heartbeat-ms", str(t.heartbeat_ms),
        "--start-after-ms", str(t.start_after_ms), "--grace", "1",
    ])


def counted(r: redis.Redis, key: str, rid: str) -> Callable[[], int | None]:
    """A check that hash ``key`` counts the run (chaos_app's handler began, or finished, it)."""
    return lambda: counts(r, key).get(rid)


def stall_before_start(r: redis.Redis, client: Client, fleet: Fleet, stall: Callable[[], None],
                       resume: Callable[[], None], t: Timing) -> tuple[Job, str]:
    """Schedule jobs until worker A is stalled while running one whose start is not recorded
    yet (A's start loop or heartbeat may win the race: then let that job be and try again).

    A's handler outlasts the stall (so that A's start, not its report, is what comes back);
    B's attempt lasts 3 s, so B is live and heartbeating when A resumes."""
    for _ in range(6):
        sleeps = [t.visibility_ms * 3 / 1000 + 3, 3]
        job = client.schedule("sleep", {"sleeps": sleeps}, max_attempts=2)
        rid = next_run(job)
        wait_for(counted(r, STARTS, rid), 20, "A's handler to begin", fleet)
        stall()
        if run_state(r, rid).get("state") == "dispatched":
            return job, rid
        resume()
        wait_for(counted(r, FINISHES, rid), 20, "the job to finish", fleet)
    raise AssertionError("worker A recorded its start before every stall")


def check_rightful_attempt_recorded(r: redis.Redis, client: Client, fleet: Fleet, job: Job,
                                    rid: str, resume: Callable[[], None], a: Proc) -> None:
    """B reclaims and runs attempt 2; A resumes; A's stale start is fenced; B's attempt wins."""
    wait_for(lambda: run_state(r, rid).get("worker") == "wb" and run_state(r, rid), 30,
             "B to reclaim and start the run", fleet)
    live = run_state(r, rid)
    assert (live["state"], live["attempt"]) == ("running", "2")
    resume()

    def a_fenced() -> bool:
        return any(e["e"] == "fenced" and e.get("r") == rid and e.get("w") == "wa"
                   for e in events(r))

    wait_for(a_fenced, 20, "A's stale start to be fenced", fleet)
    final = wait_for(lambda: run_in(r, rid, "succeeded"), 30, "B's attempt to succeed", fleet)
    assert (final["worker"], final["attempt"]) == ("wb", "2")
    history = [(at.attempt, at.status) for at in client.runs(job.id)]
    assert history == [(2, "succeeded"), (1, "abandoned")]
    assert r.zcard(keys.dead(job.partition)) == 0
    assert int(r.hget(keys.stats(job.partition), "fenced") or 0) >= 1
    wait_for(lambda: counts(r, FINISHES).get(rid) == 2, 20, "A's stale handler to end", fleet)
    assert counts(r, STARTS)[rid] == 2  # once per worker: A's attempt, then B's
    kinds = [e["e"] for e in events(r) if e.get("r") == rid]
    assert kinds.count("abandoned") == 1 and kinds.count("succeeded") == 1
    assert "start rejected" in a.log.read_text() and rid in a.log.read_text()
    assert a.alive()


@pytest.mark.parametrize("timing", [START_LOOP, HEARTBEAT_ONLY], ids=["start-loop", "heartbeat"])
def test_a_worker_stopped_before_recording_its_start_cannot_take_back_the_reclaimed_run(
    r: redis.Redis, fleets: Callable[..., Fleet], client: Client, redis_url: str, timing: Timing
) -> None:
    fleet = fleets(redis_url)
    fleet.dispatcher("d1")
    a = spawn_worker(fleet, "wa", timing)
    wait_for(lambda: started(r, ["d1", "wa"]), 30, "dispatcher and worker A to start", fleet)

    job, rid = stall_before_start(r, client, fleet, lambda: a.send(signal.SIGSTOP),
                                  lambda: a.send(signal.SIGCONT), timing)
    spawn_worker(fleet, "wb", timing)  # only now, so that A is the one that read the entry
    check_rightful_attempt_recorded(r, client, fleet, job, rid, lambda: a.send(signal.SIGCONT), a)


def test_a_worker_whose_connection_froze_before_recording_its_start_is_fenced_when_it_thaws(
    r: redis.Redis, fleets: Callable[..., Fleet], client: Client, redis_url: str,
    closing: Callable[[TcpProxy], TcpProxy],
) -> None:
    """No signal at all: A's Redis connection stops delivering (a proxy holds the bytes), then
    delivers everything at once, the start A sent meanwhile included."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = closing(TcpProxy(port).start())
    fleet, proxied = fleets(redis_url), fleets(proxy.url)
    proxied.env["CHAOS_SINK_URL"] = redis_url  # the handlers' records bypass the proxy
    fleet.dispatcher("d1")
    a = spawn_worker(proxied, "wa", HEARTBEAT_ONLY)
    wait_for(lambda: started(r, ["d1", "wa"]), 30, "dispatcher and worker A to start", fleet)

    job, rid = stall_before_start(r, client, fleet, proxy.freeze, proxy.thaw, HEARTBEAT_ONLY)
    spawn_worker(fleet, "wb", HEARTBEAT_ONLY)
    check_rightful_attempt_recorded(r, client, fleet, job, rid, proxy.thaw, a)
