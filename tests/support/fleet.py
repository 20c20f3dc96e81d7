"""Real dispatcher and worker processes for the tests that run a fleet (tests/processes): the
Fleet that starts them against one redis-server, its fixtures (``fleets``, ``fleet``, ``client``,
``closing``: a test module binds the ones it uses to module names), and the probes of what they
did (leases, events, run states) that every wait polls with a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from rsched import Client, Job, JobSpec
from rsched.archive.events import expand
from rsched.core.models import run_fields
from rsched.rdb import keys
from support.helpers import all_jobs, hgetall, with_run_fields
from support.redis_server import _die_with_parent

TESTS = Path(__file__).resolve().parents[1]
PARTITIONS = 16
LEASE_MS = 1500
VISIBILITY_MS = 2000
HEARTBEAT_MS = 300
T = TypeVar("T")


class Proc:
    """One rsched process; its stdout and stderr go to a log file the failure report shows."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=TESTS,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.name} (pid {self.pid}, rc {self.popen.poll()}) ---\n" + "\n".join(text)

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
        self.popen.wait(10)


class Fleet:
    """Dispatchers and workers of one test, all pointed at one Redis, killed at teardown."""

    def __init__(self, redis_url: str, log_dir: Path, *, unsafe: bool = True) -> None:
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.unsafe = unsafe
        self.procs: dict[str, Proc] = {}
        # The fleet tests read every event their runs made (events, event_counts): the events
        # streams keep them all unless a test sets a bound (test_memory_bound.py).
        self.env = dict(os.environ, RSCHED_REDIS_URL=redis_url, RSCHED_PARTITIONS=str(PARTITIONS),
                        RSCHED_EVENTS_KEEP="0", RSCHED_EVENTS_KEEP_MS="0")
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p
        )

    def _spawn(self, name: str, command: list[str]) -> Proc:
        argv = [sys.executable, "-m", "rsched.cli"]
        argv += ["--allow-unsafe-redis"] if self.unsafe else []
        proc = Proc(name, argv + command + ["--id", name], self.env, self.log_dir / f"{name}.log")
        self.procs[name] = proc
        return proc

    def dispatcher(self, name: str, lease_ms: int = LEASE_MS) -> Proc:
        return self._spawn(name, ["dispatcher", "--lease-ms", str(lease_ms)])

    def worker(
        self, name: str, *, queues: str = "default", grace_s: float = 5.0, concurrency: int = 16,
        app: str = "support.chaos_app:app",
    ) -> Proc:
        return self._spawn(
            name,
            [
                "worker",
                "--app",
                app,
                "--queues",
                queues,
                "--concurrency",
                str(concurrency),
                "--visibility-ms",
                str(VISIBILITY_MS),
                "--heartbeat-ms",
                str(HEARTBEAT_MS),
                "--grace",
                str(grace_s),
            ],
        )

    def archiver(self, name: str, archive_url: str) -> Proc:
        return self._spawn(name, ["archiver", "--archive-url", archive_url, "--poll-ms", "20"])

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs.values())

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stop()


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(redis_url: str, *, unsafe: bool = True) -> Fleet:
        made.append(Fleet(redis_url, tmp_path, unsafe=unsafe))
        return made[-1]

    yield make
    for fleet in made:
        fleet.close()
        print(fleet.logs())  # shown by pytest when the test failed


@pytest.fixture
def closing() -> Iterator[Callable[[T], T]]:
    """Hands back what it is given and closes it after the test (clients, connections)."""
    things: list[Any] = []

    def keep(thing: T) -> T:
        things.append(thing)
        return thing

    yield keep
    for thing in things:
        thing.close()


@pytest.fixture
def fleet(redis_url: str, fleets: Callable[..., Fleet]) -> Fleet:
    """A fleet on the session server (clean keyspace)."""
    return fleets(redis_url)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    c = Client(redis_url)
    yield c
    c.close()


def wait_for(
    check: Callable[[], T | None], timeout_s: float, what: str, fleet: Fleet | None = None
) -> T:
    """Poll `check` until it returns something truthy; Redis being away counts as not yet."""
    deadline = time.monotonic() + timeout_s
    value: T | Exception | None = None
    while True:
        try:
            value = check()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            value = e
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            logs = fleet.logs() if fleet else ""
            raise AssertionError(f"waited {timeout_s} s for {what}; last: {value!r}\n{logs}")
        time.sleep(0.05)


def leases(r: redis.Redis) -> dict[int, tuple[str, int]]:
    """Partition -> (owner, fence) as the lease hashes say, owner '' when free or expired."""
    pipe = r.pipeline(transaction=False)
    pipe.time()
    for p in range(PARTITIONS):
        pipe.hmget(keys.lease(p), "owner", "fence", "expires_ms")
    now_s, now_us = (res := pipe.execute())[0]
    now = now_s * 1000 + now_us // 1000
    out = {}
    for p, (owner, fence, expires) in enumerate(res[1:]):
        live = owner and int(expires or 0) > now
        out[p] = (owner.decode() if live else "", int(fence or 0))
    return out


def owned_by(r: redis.Redis, parts: list[int], owner: str) -> dict[int, tuple[str, int]] | None:
    """All leases once `owner` holds every one of `parts`, else None."""
    got = leases(r)
    return got if all(got[p][0] == owner for p in parts) else None


def shares(r: redis.Redis) -> Counter[str]:
    return Counter(owner for owner, _ in leases(r).values())


def balanced(r: redis.Redis, names: list[str]) -> bool:
    """Every partition owned, by exactly these dispatchers, in an even split."""
    got = shares(r)
    even = {PARTITIONS // len(names), -(-PARTITIONS // len(names))}
    return set(got) == set(names) and set(got.values()) <= even


def started(r: redis.Redis, names: list[str]) -> bool:
    """Every named process has registered: dispatchers in the live set, workers by heartbeat."""
    pipe = r.pipeline(transaction=False)
    for name in names:
        if name.startswith("d"):
            pipe.zscore(keys.dispatchers(), name)
        else:
            pipe.hexists(keys.workers(), name)
    return all(pipe.execute())


def events(r: redis.Redis) -> list[dict[str, str]]:
    """Every history event of every partition."""
    pipe = r.pipeline(transaction=False)
    for p in range(PARTITIONS):
        pipe.xrange(keys.events(p))
    return [
        with_run_fields({k.decode(): v.decode() for k, v in fields.items()})
        for res in pipe.execute()
        for sid, entry in res
        for _, fields in expand(sid, entry)
    ]


def event_counts(r: redis.Redis) -> Counter[tuple[str, str]]:
    """(event type, run id) -> how many times it was recorded."""
    return Counter((e["e"], e.get("r", "")) for e in events(r))


def counts(r: redis.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in hgetall(r, key).items()}


def run_state(r: redis.Redis, run_id: str) -> dict[str, str]:
    """The run's fields: its own hash, or the job hash's for a one-off job's own run."""
    job_id = run_id.rsplit("@", 1)[0]
    p = int(job_id.split("-", 1)[0])
    h = run_fields(run_id, hgetall(r, keys.run(p, run_id)), hgetall(r, keys.job(p, job_id))) or {}
    return {k.decode(): v.decode() for k, v in h.items()}


def run_in(r: redis.Redis, run_id: str, state: str) -> dict[str, str] | None:
    """The run's hash once it is in `state`, else None."""
    got = run_state(r, run_id)
    return got if got.get("state") == state else None


def schedule(client: Client, specs: list[JobSpec]) -> list[Job]:
    return all_jobs(client.schedule_many(specs))


def quiet(r: redis.Redis) -> bool:
    """No occurrence dispatched but not finished: every dispatched run has succeeded (or was
    stopped by overlap cancelPrevious)."""
    evts = event_counts(r)
    pending = {rid for e, rid in evts if e == "dispatched"}
    return not (pending - {rid for e, rid in evts if e in ("succeeded", "cancelled")})


def report(name: str, t0: float, starts: dict[str, int], **figures: Any) -> None:
    """One line of figures per test (pytest -s shows it): extra executions are starts beyond
    the first of each run id, expected only where a fault forced a second attempt."""
    figures["extra_executions"] = sum(n - 1 for n in starts.values() if n > 1)
    figures["seconds"] = round(time.monotonic() - t0, 1)
    print(f"CHAOS {name} " + json.dumps(figures, sort_keys=True))
