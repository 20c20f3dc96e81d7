"""Queue-wide limits against a real Redis: the permit script's rules (lua/queue_permit.lua),
and a dispatcher's and a worker's real loops under a queue's concurrency and rate, every run of
the queue counted whether it has a limit key or not; the faces (API, CLI, client) and their
refusals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient
from support.cli import as_json, ok, rsched
from support.fleet import events
from support.helpers import problem_of, run_engine
from support.helpers import settings as _settings

from rsched import App, Client, JobContext, JobSpec
from rsched.api.app import create_app
from rsched.core.errors import NotFound, ValidationError
from rsched.core.models import Job
from rsched.rdb import keys
from rsched.rdb.queue_limits import GIVE, KEEP, TAKE, PermitOp, op_permit

Q = "default"
T0 = 1_800_000_000_000


def permit(client: Client, now: int, *ops: tuple[str, str, str, int],
           ttl: int = 1000) -> tuple[list[int], list[tuple[int, str]]]:
    """lua/queue_permit.lua on queue Q at ``now``: the results and the runs to wake."""
    reply = client.run(op_permit(Q, [PermitOp(*o) for o in ops], ttl, now))
    return reply.results, reply.wake


def test_permits_cap_the_queue_expire_unkept_and_are_fenced_by_worker(
    client: Client, r: redis.Redis
) -> None:
    r.set(keys.queue_limit(Q), "2 0 0")
    a, b, c = (f"j{i}@{T0 + i}" for i in range(3))
    assert permit(client, T0, (TAKE, a, "w1", 0), (TAKE, b, "w2", 1)) == ([0, 0], [])
    # At the limit: c waits (the first waiting runs ask again after 2 s).
    assert permit(client, T0, (TAKE, c, "w1", 2)) == ([2000], [])
    assert r.zrange(keys.queue_limit_waiting(Q), 0, -1) == [f"2 {c}".encode()]
    # Another worker (a reclaim of a's run) can neither keep nor give back w1's permit.
    assert permit(client, T0 + 10, (KEEP, a, "w9", 0), (GIVE, a, "w9", 0)) == ([0, 0], [])
    assert permit(client, T0 + 10, (KEEP, a, "w1", 0)) == ([1], [])
    # b is given back: its permit is reserved for c, the earliest waiting run, to wake.
    assert permit(client, T0 + 20, (GIVE, b, "w2", 1)) == ([1], [(2, c)])
    d = f"j3@{T0 + 3}"
    assert permit(client, T0 + 21, (TAKE, d, "w2", 3))[0] == [2000]  # c's turn, not d's
    assert permit(client, T0 + 22, (TAKE, c, "w3", 2)) == ([0], [])  # its reservation
    # w1 dies: a's permit is not kept and expires 1 s after its last keep; d gets it.
    assert permit(client, T0 + 1009, (TAKE, d, "w2", 3))[0] == [2000]
    assert permit(client, T0 + 1011, (TAKE, d, "w2", 3)) == ([0], [])
    assert r.zcard(keys.queue_limit_waiting(Q)) == 0
    assert sorted(r.zrange(keys.queue_permits(Q), 0, -1)) == [f"{c} w3".encode(),
                                                             f"{d} w2".encode()]


def test_a_queue_rate_is_a_sliding_window_and_a_deleted_limit_grants_every_take(
    client: Client, r: redis.Redis
) -> None:
    r.set(keys.queue_limit(Q), "0 2 1000")
    runs = [f"j{i}@{T0 + i}" for i in range(4)]
    assert permit(client, T0, *((TAKE, rid, "w1", 0) for rid in runs[:2]))[0] == [0, 0]
    assert permit(client, T0 + 400, (TAKE, runs[2], "w1", 0))[0] == [600]  # when it may start
    assert permit(client, T0 + 1001, (TAKE, runs[2], "w1", 0))[0] == [0]
    r.delete(keys.queue_limit(Q))
    assert permit(client, T0 + 1002, (TAKE, runs[3], "w1", 0))[0] == [0]


def test_a_raised_limit_reserves_permits_for_waiting_runs_and_a_lowered_one_starts_none(
    client: Client, r: redis.Redis
) -> None:
    client.set_queue_limit(Q, concurrency=1)
    a, b, c = (f"j{i}@{T0 + i}" for i in range(3))
    now = client.now_ms()
    assert permit(client, now, (TAKE, a, "w1", 0), (TAKE, b, "w1", 1))[0] == [0, 2000]
    client.set_queue_limit(Q, concurrency=2)  # b's permit is reserved at once
    assert r.zscore(keys.queue_permits(Q), f"> {b}") is not None
    assert permit(client, now + 1, (TAKE, c, "w2", 2))[0] == [2000]  # not before b
    assert permit(client, now + 2, (TAKE, b, "w1", 1))[0] == [0]
    client.set_queue_limit(Q, concurrency=1)  # two held: none starts until one is left
    assert permit(client, now + 3, (GIVE, a, "w1", 0), (TAKE, c, "w2", 2))[0] == [1, 2000]
    assert permit(client, now + 4, (GIVE, b, "w1", 1)) == ([1], [(2, c)])


def engine_app(most: list[int], done: list[str], starts: list[float]) -> App:
    app = App("queue-limits")
    running = [0]

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        running[0] += 1
        starts.append(time.monotonic())
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.05)
        running[0] -= 1
        done.append(ctx.run_id)

    return app


def test_a_queue_concurrency_caps_every_run_of_the_queue_keyed_or_not(
    redis_url: str, client: Client
) -> None:
    client.set_limit("tenant-*", concurrency=5)  # never reached: the queue's limit binds
    client.set_queue_limit(Q, concurrency=2)
    most, done, starts = [0], list[str](), list[float]()
    specs = [JobSpec("t") for _ in range(10)]
    specs += [JobSpec("t", limit_key=f"tenant-{i % 2}") for i in range(8)]
    jobs = client.schedule_many(specs)
    assert all(isinstance(j, Job) for j in jobs)
    asyncio.run(run_engine(redis_url, engine_app(most, done, starts),
                           lambda: len(done) >= len(specs), timeout_s=60))
    # The cap; that it is also reached is the fleet test's (tests/processes), whose handlers run
    # long enough to overlap on a busy machine: 50 ms ones here may run one at a time.
    assert 1 <= most[0] <= 2 and len(set(done)) == len(specs)
    # A given-back permit wakes the next waiting run: no gap near the 2 s recheck.
    starts.sort()
    assert max(b - a for a, b in zip(starts, starts[1:], strict=False)) < 1.5, starts
    for j in jobs:
        assert isinstance(j, Job)
        assert client.get_run(f"{j.id}@{j.next_ms}").attempt == 1  # waiting spent none
    view = client.get_queue_limit(Q)
    assert (view.limit.concurrency, view.in_flight, view.waiting) == (2, 0, 0)


def test_a_queue_rate_lets_at_most_its_limit_start_in_any_window_and_a_backlog_asks_once(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    client.set_queue_limit(Q, rate=(8, 1))
    most, done, starts = [0], list[str](), list[float]()
    client.schedule_many([JobSpec("t") for _ in range(48)])
    asyncio.run(run_engine(redis_url, engine_app(most, done, starts),
                           lambda: len(done) >= 48, timeout_s=60))
    starts.sort()
    # Handler starts lag their permit (taken on Redis's clock) by a little, more on a loaded
    # machine: a window of 0.75 s holds at most 8 of them.
    assert max(len([s for s in starts if t <= s < t + 0.75]) for t in starts) <= 8
    assert starts[-1] - starts[0] >= 4.7  # 48 starts at 8 a second: five windows after the first
    # Each of the 40 runs over the first window is told its turn: it asks once, or again when
    # the runs before it started late (58-64 here on a quiet machine); asking again every
    # window would be 40 + 32 + 24 + 16 + 8 = 120, and grow with the square of the backlog.
    held = sum(1 for e in events(r) if e["e"] == "deferred")
    assert 40 <= held <= 96, held


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as c:
        yield c


def test_put_get_and_delete_a_queue_limit_and_refusals_name_the_field(
    api: TestClient, client: Client, redis_url: str
) -> None:
    body = {"concurrency": 3, "rate": {"limit": 10, "periodSeconds": 1}}
    res = api.put("/queues/emails/limits", json=body)
    assert res.status_code == 200 and res.json() == {"queue": "emails", **body}
    assert api.get("/queues/emails/limits").json() == {"queue": "emails", **body,
                                                        "inFlight": 0, "waiting": 0}
    assert client.get_queue_limit("emails").limit.rate_limit == 10
    problem_of(api.put("/queues/emails/limits", json={"concurrency": 0}), 422, "concurrency")
    problem_of(api.put("/queues/bad%20name/limits", json={"concurrency": 1}), 422, "queue")
    problem_of(api.put("/queues/emails/limits", json={"rate": {"limit": 1,
                                                               "periodSeconds": 0}}),
               422, "rate.periodSeconds")
    assert api.get("/queues/emails/limits").json()["concurrency"] == 3  # nothing stored
    assert api.delete("/queues/emails/limits").status_code == 204
    problem_of(api.get("/queues/emails/limits"), 404)
    problem_of(api.delete("/queues/emails/limits"), 404)
    with pytest.raises(NotFound):
        client.get_queue_limit("emails")
    # The CLI: --queue instead of NAME.
    got = as_json(redis_url, "limits", "set", "--queue", "emails", "--concurrency", "4")
    assert got == {"queue": "emails", "concurrency": 4, "rate": None}
    assert "emails" in ok(redis_url, "limits", "show", "--queue", "emails")
    for args, flag in ((["limits", "set", "--queue", "a b", "--concurrency", "1"], "--queue"),
                       (["limits", "set", "x", "--queue", "q", "--concurrency", "1"], "NAME"),
                       (["limits", "set", "--queue", "q", "--rate", "0/1s"], "--rate")):
        with pytest.raises(ValidationError) as caught:
            rsched(redis_url, *args)
        assert caught.value.field == flag
    assert ok(redis_url, "limits", "delete", "--queue", "emails").strip() == (
        "deleted queue limit emails")
