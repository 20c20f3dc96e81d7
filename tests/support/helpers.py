"""Shared helpers for the core engine tests: a hand-moved clock, keyspace snapshots, and ways to
drive a real dispatcher and worker in-process, one step at a time or as their real loops."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

import redis
import redis.asyncio as aioredis

from rsched import Client, Job, JobSpec, RschedError
from rsched.archive.events import expand
from rsched.core.handlers import App
from rsched.core.ids import run_id
from rsched.core.models import Run
from rsched.core.settings import Settings
from rsched.engine._calls import CallMany
from rsched.engine.dispatcher import Dispatcher
from rsched.engine.dispatcher.claimer import ClaimResult
from rsched.engine.worker import Worker
from rsched.rdb import keys, scripts

PARTITIONS = 16

Hash = dict[bytes, bytes]
Entries = list[tuple[bytes, Hash]]


def hgetall(r: redis.Redis, name: str) -> Hash:
    """HGETALL as the tests' clients reply: bytes (redis-py's annotations allow any client's)."""
    return cast(Hash, r.hgetall(name))


def smembers(r: redis.Redis, name: str) -> set[bytes]:
    """SMEMBERS, typed as hgetall."""
    return cast(set[bytes], r.smembers(name))


def xrange(r: redis.Redis, name: str, *, count: int | None = None) -> Entries:
    """XRANGE as the tests' clients reply: (id, fields) in bytes, never None (see hgetall)."""
    return cast(Entries, r.xrange(name, count=count))


def xrevrange(r: redis.Redis, name: str, *, count: int | None = None) -> Entries:
    """XREVRANGE, typed as xrange."""
    return cast(Entries, r.xrevrange(name, count=count))


def summary(error: str | None) -> str | None:
    """A recorded error's first line: ``Type: message``, before its traceback."""
    return None if error is None else error.partition("\n")[0]


def overdue(client: Client, specs: list[JobSpec]) -> list[Job]:
    """Jobs already due that wait in the due set, as after a dispatcher outage (a job scheduled
    due goes straight to its queue instead): each created paused, then resumed."""
    jobs = all_jobs(client.schedule_many([replace(s, paused=True) for s in specs]))
    return [client.resume(j.id) for j in jobs]


def all_jobs(results: list[Job | RschedError]) -> list[Job]:
    """``schedule_many``'s results, each a job: a failed spec fails the test."""
    errors = [j for j in results if isinstance(j, Exception)]
    assert not errors, errors[:3]
    return [j for j in results if not isinstance(j, Exception)]


def next_ms(job: Job) -> int:
    """When the job's next occurrence is due (a scheduled job has one)."""
    assert job.next_ms is not None, job
    return job.next_ms


def next_run(job: Job) -> str:
    """The run id of the job's next occurrence."""
    return run_id(job.id, next_ms(job))


class ManualClock:
    """An injected ms clock that only moves when a test moves it."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms


def open_client(redis_url: str) -> Iterator[Client]:
    """Body of the shared ``client`` fixture: a Client on the test keyspace, closed after."""
    c = Client(settings=settings(redis_url))
    try:
        yield c
    finally:
        c.close()


@contextlib.asynccontextmanager
async def aredis(url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(url)
    try:
        yield r
    finally:
        await r.aclose()


def redis_now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def settings(redis_url: str, **overrides: Any) -> Settings:
    """Test settings: AOF is off on the test server (a warning only), everything else default."""
    return Settings.from_env(redis_url=redis_url, **overrides)


def record_script_calls(name: str) -> tuple[list[scripts.Call], CallMany]:
    """A call_many for a Dispatcher or Worker that sends its calls with scripts.acall_many and
    keeps every call of script ``name`` in the list, to apply one again by hand (what redis-py's
    retry after a lost reply does)."""
    calls: list[scripts.Call] = []

    async def recording(r: Any, batch: list[scripts.Call]) -> list[Any]:
        calls.extend(c for c in batch if c[0] == name)
        return await scripts.acall_many(r, batch)

    return calls, recording


class Monitor:
    """What reached Redis, read with MONITOR: every command in the order Redis ran it, a
    script's own commands (client "lua") right after the EVALSHA that ran them.  A test reads
    this instead of patching the code that sends the commands.  Use as a context manager."""

    _LINE = re.compile(rb"^[0-9.]+ \[[0-9]+ ([^\]]+)\] (.*)$", re.S)
    _ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.S)
    _ESCAPE = re.compile(rb"\\(x[0-9a-f]{2}|.)", re.S)  # how Redis quotes an argument
    _CHARS = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}

    def __init__(self, r: redis.Redis) -> None:
        self._r = r
        self._marks = 0

    def __enter__(self) -> Monitor:
        self._monitor = self._r.monitor().__enter__()  # sends MONITOR, checks its OK
        self.commands()  # not the handshake of the connection the markers go through
        return self

    def __exit__(self, *exc: object) -> None:
        self._monitor.__exit__(*exc)

    def commands(self) -> list[MonitoredCommand]:
        """The commands run since the last call (or MONITOR), up to a marker this sends."""
        self._marks += 1
        marker = f"rsched-test-monitor-{id(self)}-{self._marks}".encode()
        self._r.echo(marker)
        out: list[MonitoredCommand] = []
        while True:
            c = self._parse(self._monitor.connection.read_response())
            if c.args == [b"ECHO", marker]:
                return out
            out.append(c)

    @classmethod
    def _parse(cls, line: Any) -> MonitoredCommand:
        m = cls._LINE.match(line.encode() if isinstance(line, str) else line)
        assert m, f"not a MONITOR line: {line!r}"

        def unquote(e: re.Match[bytes]) -> bytes:
            c = e[1]
            return bytes([int(c[1:], 16)]) if len(c) == 3 else cls._CHARS.get(c, c)

        args = [cls._ESCAPE.sub(unquote, a) for a in cls._ARG.findall(m[2])]
        return MonitoredCommand(m[1].decode(), [args[0].upper(), *args[1:]])


@dataclass(frozen=True)
class MonitoredCommand:
    client: str  # "host:port", or "lua" for a command a script ran
    args: list[bytes]  # the command's name (upper case), then its arguments


def snapshot(r: redis.Redis) -> dict[bytes, bytes | None]:
    """DUMP of every key: equal snapshots mean nothing in the keyspace changed."""
    names = sorted(r.scan_iter(count=1000))
    pipe = r.pipeline(transaction=False)
    for k in names:
        pipe.dump(k)
    return dict(zip(names, pipe.execute(), strict=True))


def with_run_fields(e: dict[str, str]) -> dict[str, str]:
    """A decoded history event with the job id 'j' and scheduled time 's' that run events leave
    to their run id 'r' (``<job id>@<scheduled ms>``)."""
    if "r" in e:
        job_id, _, sched = e["r"].rpartition("@")
        e.setdefault("j", job_id)
        e.setdefault("s", sched)
    return e


def events(r: redis.Redis, p: int, *, job_id: str | None = None) -> list[dict[str, str]]:
    """The partition's history events, oldest first, decoded (see with_run_fields); optionally
    one job's only."""
    out: list[dict[str, str]] = []
    for sid, entry in xrange(r, keys.events(p)):
        for _, fields in expand(sid, entry):  # a script's events of one kind share an entry
            e = with_run_fields({k.decode(): v.decode() for k, v in fields.items()})
            if job_id is None or e.get("j") == job_id:
                out.append(e)
    return out


def event_types(r: redis.Redis, p: int, job_id: str | None = None) -> list[str]:
    return [e["e"] for e in events(r, p, job_id=job_id)]


def stats(r: redis.Redis, p: int) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in hgetall(r, keys.stats(p)).items()}


def stream_entries(r: redis.Redis, p: int, queue: str = "default") -> list[dict[str, str]]:
    """A queue stream's entries as dicts, with the job id and scheduled time their run id holds
    (see with_run_fields)."""
    return [with_run_fields({k.decode(): v.decode(errors="replace") for k, v in f.items()})
            for _, f in xrange(r, keys.stream(p, queue))]


class Rig:
    """A real Dispatcher (lease keeper + claimer) and Worker, stepped by hand in one event loop.

    Use inside ``asyncio.run``: ``async with Rig(url, app, clock=clock) as rig: ...``.
    """

    def __init__(
        self,
        redis_url: str,
        app: App | None = None,
        *,
        clock: Callable[[], int] | None = None,
        dispatcher_id: str = "d-test",
        worker_id: str = "w-test",
        settings_overrides: dict[str, Any] | None = None,
        dispatcher_kw: dict[str, Any] | None = None,
        worker_kw: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings(redis_url, **(settings_overrides or {}))
        self.app = app or App("test")
        self.clock = clock
        self._dispatcher_id = dispatcher_id
        self._worker_id = worker_id
        self._dispatcher_kw = dispatcher_kw or {}
        self._worker_kw = worker_kw or {}
        self.dispatcher: Dispatcher
        self.worker: Worker
        self.workers: list[Worker] = []

    async def __aenter__(self) -> Rig:
        self.dispatcher = Dispatcher(
            self.settings, dispatcher_id=self._dispatcher_id, clock=self.clock,
            **self._dispatcher_kw,
        )
        self.worker = Worker(self.app, self.settings, worker_id=self._worker_id, **self._worker_kw)
        self.workers.append(self.worker)
        await self.dispatcher.setup()
        await self.worker.setup()
        return self

    async def add_worker(self, worker_id: str, **worker_kw: Any) -> Worker:
        """Another worker on the same app (to reclaim from the first one)."""
        w = Worker(self.app, self.settings, worker_id=worker_id, **worker_kw)
        self.workers.append(w)
        await w.setup()
        return w

    async def __aexit__(self, *exc: object) -> None:
        for w in self.workers:
            await w.close()
        await self.dispatcher.r.aclose()

    async def lease(self) -> dict[int, int]:
        assert self.dispatcher.leases
        return await self.dispatcher.leases.run_once()

    async def claim(self, *, renew: bool = True) -> ClaimResult:
        """One claim round; first renew the leases (as the real loop does every lease_ms / 3),
        since a test's clock jumps further than that."""
        if renew:
            await self.lease()
        return await self.dispatcher.claim_once()

    async def fetch(self, block_ms: int = 20, worker: Worker | None = None) -> int:
        return await (worker or self.worker).fetch_once(block_ms=block_ms)

    async def finish(self, timeout_s: float = 10, worker: Worker | None = None) -> int:
        """Wait for every started run's handler, then report the outcomes (one flush)."""
        w = worker or self.worker
        pending = await w.wait_handlers(timeout_s)
        assert not pending, f"{pending} handlers still running after {timeout_s} s"
        return await w.flush_once()

    async def cycle(self) -> tuple[ClaimResult, int, int]:
        """Claim what is due, start it, let it finish and report: (claim, started, reported)."""
        claimed = await self.claim()
        started = await self.fetch()
        reported = await self.finish()
        return claimed, started, reported


async def run_engine(
    redis_url: str,
    app: App,
    until: Callable[[], bool],
    *,
    timeout_s: float = 10,
    dispatcher_kw: dict[str, Any] | None = None,
    worker_kw: dict[str, Any] | None = None,
    while_running: Callable[[], Awaitable[None]] | None = None,
    settings_kw: dict[str, Any] | None = None,
) -> None:
    """Run a Dispatcher's and a Worker's real loops in this event loop until ``until()`` holds.

    ``while_running`` (optional) is awaited once both loops run, e.g. to schedule jobs;
    ``settings_kw``: settings of both (a cluster without replicas needs wait_replicas=0).
    A loop that dies raises here; ``until`` not holding within the deadline fails the test.
    """
    s = settings(redis_url, **(settings_kw or {}))
    stop = asyncio.Event()
    d = Dispatcher(s, **(dispatcher_kw or {}))
    w = Worker(app, s, **(worker_kw or {}))
    loops = [asyncio.create_task(d.run(stop)), asyncio.create_task(w.run(stop))]
    try:
        if while_running is not None:
            await while_running()
        deadline = time.monotonic() + timeout_s
        while not until():
            for t in loops:
                if t.done():
                    t.result()  # raises what killed it
                    raise AssertionError("an engine loop stopped on its own")
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s} s")
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loops, return_exceptions=True), 15)


def keys_in_partition(p: int, n: int, prefix: str = "k") -> list[str]:
    """``n`` idempotency keys whose jobs land in partition ``p`` (to test one partition's order)."""
    from rsched.core.ids import partition_for_key

    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}-{i}"
        if partition_for_key(key, PARTITIONS) == p:
            out.append(key)
        i += 1
    return out


PROBLEM = "application/problem+json"


def problem_of(res: Any, status: int, field: str | None = None) -> dict[str, Any]:
    assert res.status_code == status, res.text
    assert res.headers["content-type"] == PROBLEM
    body: dict[str, Any] = res.json()
    assert body["status"] == status and body["title"] and body["type"].startswith("urn:rsched:")
    if field is not None:
        assert body["errors"][0]["field"] == field
        assert body["detail"].startswith(f"{field}: ")
    return body


def run_of(client: Client, run_id: str) -> Run:
    run = client.run(client.op_read_runs([run_id]))[0]
    assert run is not None, run_id
    return run


def job_field(r: redis.Redis, job_id: str, name: str) -> str | None:
    v = hgetall(r, keys.job(int(job_id.split("-")[0]), job_id)).get(name.encode())
    return v.decode() if v is not None else None

