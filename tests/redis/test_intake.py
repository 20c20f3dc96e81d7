"""The worker's reads with few free slots for many streams: focused on a few busy streams (so a
report batches many runs of one partition), yet every stream is read at least every FOCUS_S."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import redis
from support.helpers import keys_in_partition, settings

from rsched import App, Client, JobContext, JobSpec
from rsched.core import defaults
from rsched.engine.worker import Worker
from rsched.rdb import keys, scripts
from rsched.rdb.worker_streams import raw_entries

A, B = 2, 9  # two partitions of the 16
T = TypeVar("T")


def due_jobs(client: Client, p: int, n: int, prefix: str) -> None:
    """n jobs due now in partition p: queued at once (no dispatcher needed)."""
    client.schedule_many([JobSpec("noop", idempotency_key=k)
                          for k in keys_in_partition(p, n, prefix)])


def noop_app() -> App:
    app = App("intake")

    @app.job("noop")
    async def noop(ctx: JobContext) -> None:
        return None

    return app


async def step(w: Worker) -> int:
    """One read, its handlers run to the end, one report."""
    n = await w.fetch_once(block_ms=20)
    await w.wait_handlers(5)
    await w.flush_once()
    return n


def on_worker(redis_url: str, scenario: Callable[[Worker], Awaitable[T]]) -> T:
    """``scenario(w)`` on a set-up worker at concurrency 16 (16 slots, 16 streams)."""

    async def run() -> T:
        w = Worker(noop_app(), settings(redis_url), concurrency=16)
        try:
            await w.setup()
            return await scenario(w)
        finally:
            await w.close()

    return asyncio.run(run())


def test_with_few_free_slots_a_read_takes_all_it_can_from_one_busy_stream_in_turn(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    due_jobs(client, A, 40, "a")
    due_jobs(client, B, 40, "b")

    def done() -> list[int]:
        return [int(r.hget(keys.stats(p), "succeeded") or 0) for p in (A, B)]

    async def scenario(w: Worker) -> tuple[list[int], list[list[int]]]:
        taken, seen = [], []
        for _ in range(3):
            taken.append(await step(w))
            seen.append(done())
        return taken, seen

    # The first read takes one entry a stream (16 slots, 16 streams) and learns A and B are
    # busy; the next ones take 16 from one of them, in turn, so each report is one complete
    # call (before: 2 a read, one report call per run; then 8 from each, two calls a report).
    taken, seen = on_worker(redis_url, scenario)
    assert taken == [2, 16, 16]
    assert seen[0] == [1, 1]
    assert sorted(seen[1]) == [1, 17]
    assert seen[2] == [17, 17]


def test_the_periodic_look_at_other_streams_leaves_busy_streams_to_focused_reads(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    due_jobs(client, A, 40, "a")
    due_jobs(client, B, 40, "b")

    async def scenario(w: Worker) -> list[int]:
        taken = [await step(w)]  # a full read: A and B are busy
        for _ in range(2):
            await asyncio.sleep(defaults.FOCUS_S)  # every other stream is looked at now
            taken.append(await step(w))
        return taken

    # Each look at the other 14 streams goes with a focused read of 16 from A or B.  It was a
    # read of every stream, one entry each: 1 from A and 1 from B, two complete calls of one
    # run each.
    assert on_worker(redis_url, scenario) == [2, 16, 16]
    assert [int(r.hget(keys.stats(p), "succeeded") or 0) for p in (A, B)] == [17, 17]


def test_a_stream_a_read_came_back_short_from_is_no_longer_read_in_turn(
    redis_url: str, client: Client
) -> None:
    due_jobs(client, A, 2, "a")
    due_jobs(client, B, 60, "b")

    async def scenario(w: Worker) -> list[int]:
        return [await step(w) for _ in range(5)]

    # A full read (A and B busy), 16 from B, A's last entry: A came back short and leaves the
    # turn, so the next reads take 16 from B each.  Kept in turn, A would give an empty read,
    # then a full read of one entry a stream: [..., 16, 1].
    assert on_worker(redis_url, scenario) == [2, 16, 1, 16, 16]


def test_a_stream_that_became_busy_is_read_within_focus_s_while_another_stays_busy(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    due_jobs(client, A, 3000, "a")

    async def scenario(w: Worker) -> float:
        await step(w)  # A is busy
        due_jobs(client, B, 1, "b")
        t0 = time.monotonic()
        while int(r.hget(keys.stats(B), "succeeded") or 0) == 0:
            assert time.monotonic() - t0 < 2, "B's job was not read"
            await step(w)
        return time.monotonic() - t0

    waited = on_worker(redis_url, scenario)
    assert waited < defaults.FOCUS_S + 1.0  # generous: a shared machine
    assert int(r.hget(keys.stats(A), "succeeded") or 0) < 3000  # A still had work meanwhile


# --- reads that go with reports ------------------------------------------------------------------


def with_full_table(redis_url: str, then: Callable[[Worker], Awaitable[T]]) -> T:
    """``then(w)`` on a worker at concurrency 4 reading partition A's stream only, after two
    reads of 4 runs whose handlers are done: 8 outcomes wait for their report, no slot is free,
    and the fetch loop would wait (what `Worker.run` lets a report read for: `read_along`, opened
    with the intake as its reader)."""

    async def scenario() -> T:
        w = Worker(noop_app(), settings(redis_url), concurrency=4)
        try:
            await w.setup()
            w.link.streams = {keys.stream(A, defaults.QUEUE): (A, defaults.QUEUE)}
            w.read_along.open(w.intake)
            for _ in range(2):
                assert await w.fetch_once(block_ms=20) == 4
                await w.wait_handlers(5)
            assert w.runs.free() == 0
            return await then(w)
        finally:
            await w.close()

    return asyncio.run(scenario())


def test_a_report_takes_the_next_read_along_while_the_fetch_loop_waits_for_slots(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    due_jobs(client, A, 12, "a")

    async def then(w: Worker) -> tuple[int, int]:
        with w.read_along.waiting(asyncio.Event()):
            assert await w.flush_once() == 8
            taken = len(w.runs)  # read in the report's round trip, no fetch_once
            await w.wait_handlers(5)
        await w.flush_once()
        return taken, int(r.hget(keys.stats(A), "succeeded") or 0)

    assert with_full_table(redis_url, then) == (4, 12)


def test_a_report_without_a_read_goes_raw_too_not_through_redis_pys_pipeline(
    redis_url: str, client: Client, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    due_jobs(client, A, 12, "a")

    async def then(w: Worker) -> int:
        def no_pipeline(*args: object, **kwargs: object) -> None:
            raise AssertionError("a report went through redis-py's pipeline")

        await w.link.r.script_load(scripts.load("complete").source)  # no NOSCRIPT retry
        monkeypatch.setattr(w.link.r, "pipeline", no_pipeline)
        assert w.read_along.plan(8) is None  # the fetch loop is not waiting: no read along
        assert await w.flush_once() == 8
        return len(w.runs)

    assert with_full_table(redis_url, then) == 0
    assert int(r.hget(keys.stats(A), "succeeded") or 0) == 8


def test_once_the_worker_stops_a_report_takes_no_new_runs(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    due_jobs(client, A, 12, "a")

    async def then(w: Worker) -> int:
        stop = asyncio.Event()
        stop.set()  # draining: what is left stays in the stream for other workers
        with w.read_along.waiting(stop):
            assert await w.flush_once() == 8
        return len(w.runs)

    assert with_full_table(redis_url, then) == 0
    # nothing delivered past the 8 reported: the other 4 wait in the stream for other workers
    assert r.xpending(keys.stream(A, defaults.QUEUE), keys.GROUP)["pending"] == 0


@pytest.mark.parametrize("resp", [
    [[b"s1", [[b"1-0", [b"r", b"a@1", b"t", b"noop"]], [b"1-1", None]]], [b"s2", []]],  # RESP2
    {b"s1": [[b"1-0", [b"r", b"a@1", b"t", b"noop"]], [b"1-1", None]], b"s2": []},  # RESP3
])
def test_a_raw_read_reply_gives_the_entries_redis_py_would_less_the_deleted_ones(
    resp: object,
) -> None:
    assert raw_entries(resp) == [("s1", "1-0", {b"r": b"a@1", b"t": b"noop"})]
    assert raw_entries(None) == []  # nothing new
