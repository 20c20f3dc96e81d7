"""The overlap of limited runs as their handlers logged it (support.chaos_app's LOG): what the
limits' fleet tests compare with each key's limit."""

from __future__ import annotations

import signal
from collections import defaultdict

import redis

from support.chaos_app import LOG
from support.fleet import Fleet, Proc

KILLED = "KILLED"  # a log line the test writes once a worker is dead: "KILLED <worker id>"


def most_at_once(log: list[str], key_of: dict[str, str]) -> dict[str, int]:
    """Limit key -> the most runs of it between their start and finish at once, as the
    handlers logged them; a killed worker's unfinished runs end where the test logged its
    death (its handlers ran no further)."""
    now: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    open_by_worker: dict[str, dict[str, str]] = defaultdict(dict)  # worker -> run -> key
    for line in log:
        if line.startswith(KILLED):
            for gone in open_by_worker.pop(line.split()[1], {}).values():
                now[gone] -= 1
            continue
        run_id, _, worker, what = line.split()
        key = key_of.get(run_id.rsplit("@", 1)[0])
        if key is None:
            continue
        if what == "start":
            open_by_worker[worker][run_id] = key
            now[key] += 1
            most[key] = max(most[key], now[key])
        elif open_by_worker[worker].pop(run_id, None) is not None:
            now[key] -= 1
    return dict(most)


def kill_mid_run(r: redis.Redis, fleet: Fleet, worker: Proc, name: str) -> None:
    """kill -9 of the worker ``name`` (its death logged, so its unfinished runs end there in
    most_at_once) and of dispatcher d1."""
    worker.send(signal.SIGKILL)
    worker.popen.wait(10)
    r.rpush(LOG, f"{KILLED} {name}")
    fleet.procs["d1"].send(signal.SIGKILL)
