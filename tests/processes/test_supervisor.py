"""`rsched worker --processes N`: real supervisor and worker processes, real signals.

A child killed with SIGKILL is replaced and jobs keep running; SIGTERM to the supervisor drains
every child (a running job finishes and is recorded) and the supervisor exits 0; a child frozen
past --hung-after is killed and replaced; a child that never starts makes the supervisor give up;
a supervisor killed with SIGKILL takes its children with it.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from support import fleet as fleet_support
from support.chaos_app import FINISHES, LOG, STARTS
from support.fleet import Fleet, Proc, counts, events, run_in, started, wait_for
from support.helpers import next_run

from rsched import Client
from rsched.cli._supervisor import Backoff
from rsched.cli.main import cli
from rsched.core.wire import as_text

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
fleets, closing = fleet_support.fleets, fleet_support.closing  # fixtures, used by name


@pytest.mark.parametrize(
    ("lives_s", "delays_s"),
    [
        ([0.1] * 9, [0.5, 1, 2, 4, 8, 16, 30, 30, 30]),  # a crash loop backs off to the cap
        ([0.1, 0.1, 0.1, 31, 0.1], [0.5, 1, 2, 0.5, 1]),  # a process that lived starts over
    ],
)
def test_restarts_back_off_while_a_process_keeps_dying_quickly(
    lives_s: list[float], delays_s: list[float]
) -> None:
    b = Backoff()
    assert [b.after_death(s) for s in lives_s] == delays_s


def children(pid: int) -> list[int]:
    """The pids of a process's children (Linux)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def supervised(redis_url: str, r: redis.Redis, fleets: Callable[..., Fleet],
               *more: str) -> tuple[Fleet, Proc]:
    """A dispatcher and `rsched worker --processes 2`, both children registered."""
    fleet = fleets(redis_url)
    fleet.dispatcher("d1")
    sup = fleet._spawn("w", [
        "worker", "--app", "support.chaos_app:app", "--processes", "2", "--concurrency", "8",
        "--visibility-ms", "2000", "--heartbeat-ms", "500", "--grace", "10", *more,
    ])
    wait_for(lambda: started(r, ["d1", "w-0", "w-1"]), 30, "both worker processes", fleet)
    return fleet, sup


def all_finish(r: redis.Redis, run_ids: list[str]) -> Callable[[], bool]:
    return lambda: all(run_in(r, rid, "succeeded") for rid in run_ids)


def test_a_killed_worker_process_is_replaced_and_jobs_keep_running(
    redis_url: str, r: redis.Redis, fleets: Callable[..., Fleet],
    closing: Callable[[Client], Client],
) -> None:
    client = closing(Client(redis_url))
    fleet, sup = supervised(redis_url, r, fleets)
    first = children(sup.pid)
    assert len(first) == 2
    before = [next_run(client.schedule("record", {})) for _ in range(20)]
    wait_for(all_finish(r, before), 30, "jobs before the kill", fleet)

    os.kill(first[0], signal.SIGKILL)
    now = wait_for(lambda: (c if len(c := children(sup.pid)) == 2 and first[0] not in c
                            else None), 30, "a new worker process", fleet)
    assert first[1] in now  # the other one was left alone
    after = [next_run(client.schedule("record", {})) for _ in range(20)]
    wait_for(all_finish(r, after), 30, "jobs after the kill", fleet)
    assert sup.alive()


def test_sigterm_drains_every_worker_process_and_the_supervisor_exits_0(
    redis_url: str, r: redis.Redis, fleets: Callable[..., Fleet],
    closing: Callable[[Client], Client],
) -> None:
    client = closing(Client(redis_url))
    fleet, sup = supervised(redis_url, r, fleets)
    kids = children(sup.pid)
    rids = [next_run(client.schedule("sleep", {"sleeps": [2]})) for _ in range(6)]
    wait_for(lambda: len(counts(r, STARTS)) == 6, 30, "every handler to begin", fleet)
    sup.send(signal.SIGTERM)
    assert sup.popen.wait(30) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in kids)
    assert counts(r, FINISHES) == dict.fromkeys(rids, 1)
    assert all(run_in(r, rid, "succeeded") for rid in rids)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["worker", "--app", "support.chaos_app:app", "--processes", "0"], "--processes"),
        (["--metrics-port", "abc", "worker", "--app", "support.chaos_app:app", "--processes", "2"],
         "--metrics-port"),
        (["worker", "--app", "support.chaos_app:app", "--dead-after", "0.1"], "--dead-after"),
        (["worker", "--app", "support.chaos_app:app", "--dead-after", "soon"], "--dead-after"),
    ],
)
def test_a_bad_processes_count_or_metrics_port_is_refused_naming_the_flag(
    args: list[str], flag: str
) -> None:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and flag in res.output and "Traceback" not in res.output


def test_a_frozen_worker_process_is_killed_and_replaced_after_hung_after(
    redis_url: str, r: redis.Redis, fleets: Callable[..., Fleet],
    closing: Callable[[Client], Client],
) -> None:
    client = closing(Client(redis_url))
    fleet, sup = supervised(redis_url, r, fleets, "--hung-after", "3")
    first = children(sup.pid)
    os.kill(first[0], signal.SIGSTOP)  # alive to the kernel, silent to the supervisor
    now = wait_for(lambda: (c if len(c := children(sup.pid)) == 2 and first[0] not in c
                            else None), 30, "the frozen process replaced", fleet)
    assert first[1] in now
    assert not Path(f"/proc/{first[0]}").exists()
    assert f"(pid {first[0]}) gave no sign of life" in sup.log.read_text()
    rids = [next_run(client.schedule("record", {})) for _ in range(10)]
    wait_for(all_finish(r, rids), 30, "jobs after the replacement", fleet)


def _adjacent_ports() -> list[socket.socket]:
    """Two listening sockets on ports N and N+1 (another process may hold an N+1: try again)."""
    for _ in range(100):
        first = socket.create_server(("127.0.0.1", 0))
        try:
            return [first, socket.create_server(("127.0.0.1", first.getsockname()[1] + 1))]
        except OSError:
            first.close()
    raise AssertionError("no two adjacent free ports")


def test_a_supervisor_gives_up_on_a_worker_process_that_never_starts(
    redis_url: str, fleets: Callable[..., Fleet]
) -> None:
    taken = _adjacent_ports()  # the children's ports, both taken: both children fail
    try:
        port = taken[0].getsockname()[1]
        fleet = fleets(redis_url)
        sup = fleet._spawn("w", ["--metrics-port", f"127.0.0.1:{port}", "worker", "--app",
                                 "support.chaos_app:app", "--processes", "2"])
        assert sup.popen.wait(90) == 1  # 5 tries: 0.5 + 1 + 2 + 4 s of backoff, and starts
        text = sup.log.read_text()
        assert "before it started, 5 times in a row: giving up" in text, text
        assert "cannot listen on" in text and "Traceback" not in text
    finally:
        for s in taken:
            s.close()


def test_a_supervisor_killed_with_sigkill_takes_its_worker_processes_with_it(
    redis_url: str, r: redis.Redis, fleets: Callable[..., Fleet],
) -> None:
    fleet, sup = supervised(redis_url, r, fleets)
    kids = children(sup.pid)
    sup.send(signal.SIGKILL)
    sup.popen.wait(10)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() and _running(pid) for pid in kids),
             30, "the orphaned worker processes to exit", fleet)


def _running(pid: int) -> bool:
    """Not a zombie (an exited child of a dead parent is reaped by init soon after)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_killed_worker_process_has_its_runs_started_again_at_once_not_after_its_timeouts(
    redis_url: str, r: redis.Redis, fleets: Callable[..., Fleet],
    closing: Callable[[Client], Client],
) -> None:
    """The supervisor marks the dead child dead in Redis for the other workers, and its
    replacement (the same worker id) takes over what is left under that id as it starts: with
    a dead-after and a visibility timeout far longer than the bound, nothing else would."""
    client = closing(Client(redis_url))
    fleet, sup = supervised(redis_url, r, fleets, "--visibility-ms", "120000",
                            "--heartbeat-ms", "30000", "--dead-after", "60")
    rids = [next_run(client.schedule("sleep", {"sleeps": [120, 1]})) for _ in range(8)]
    wait_for(lambda: set(counts(r, STARTS)) == set(rids), 30, "every run started", fleet)
    log = [as_text(line).split() for line in r.lrange(LOG, 0, -1)]
    victim = log[0][2]  # the child that runs the first of them
    pid = int(sup.log.read_text().split(f"worker process {victim[-1]} started: pid ")[1].split()[0])
    theirs = {rid for rid, _, wid, _ in log if wid == victim}

    os.kill(pid, signal.SIGKILL)
    killed_ms = client.now_ms()
    wait_for(lambda: all(counts(r, STARTS).get(rid) == 2 for rid in theirs), 30,
             "the killed process's runs to start again", fleet)
    again = [int(e["t"]) for e in events(r)
             if e["e"] == "started" and e.get("r") in theirs and e.get("a") == "2"]
    # The supervisor sees the death within POLL_S, and the next beat of a live worker (the
    # other child, or the victim's replacement as it starts) takes the runs over: seconds,
    # where the flags above would take a minute.
    assert len(again) == len(theirs) and max(again) - killed_ms <= 15_000, again
    assert "its runs handed over to live workers" in sup.log.read_text()
