"""Walking pages of dead letters and of a job's attempts: each item that stays is listed exactly
once, whatever ties of time (a mass failure dead-letters thousands in one millisecond), whatever
is added or deleted while the walk goes on."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

import redis
from support.helpers import Rig

from rsched import App, Client, JobContext, JobSpec
from rsched.core.models import job_of_run, partition_of
from rsched.rdb import keys
from rsched.rdb.job_reads import op_dead_after
from rsched.service.history import op_redis_runs_page
from rsched.service.listings import op_dead_letter_page

TIE_MS = 1_700_000_000_000
LATER = datetime(2030, 1, 1, tzinfo=UTC)


def _boom_app() -> App:
    app = App("dead-pages")

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    @app.job("fine")
    def fine(ctx: JobContext) -> None:
        return None

    return app


def _dead_letters(client: Client, redis_url: str, n: int) -> list[str]:
    """``n`` real dead letters (one-off jobs failing their one attempt): their run ids."""
    client.schedule_many([JobSpec("boom", {"i": i}, max_attempts=1) for i in range(n)])

    async def go() -> None:
        async with Rig(redis_url, _boom_app()) as rig:
            for _ in range(50):
                await rig.cycle()
                if len(_walk(client, 1000)) >= n:
                    return

    asyncio.run(go())
    ids = _walk(client, 1000)
    assert len(ids) == n
    return ids


def _walk(client: Client, limit: int, between: object = None) -> list[str]:
    """Run ids of every page of a walk, in order; ``between(page_no)`` runs after each page."""
    seen: list[str] = []
    cursor = None
    for page_no in range(10_000):
        page = client.run(op_dead_letter_page(client, limit, cursor))
        seen += [d.run.id for d in page.items]
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor
        if callable(between):
            between(page_no)
    raise AssertionError("the walk does not end")


def _tie(r: redis.Redis, run_ids: list[str], scores: list[int]) -> None:
    """Give every letter one of ``scores`` as its dead-letter time (ties across partitions)."""
    for i, rid in enumerate(run_ids):
        p = partition_of(job_of_run(rid))
        r.zadd(keys.dead(p), {rid: scores[i % len(scores)]}, xx=True)


def test_pages_of_tied_letters_list_each_once_in_the_newest_first_order(
        client: Client, redis_url: str, r: redis.Redis) -> None:
    ids = _dead_letters(client, redis_url, 240)
    _tie(r, ids, [TIE_MS, TIE_MS + 1, TIE_MS + 1])  # two thirds share one millisecond
    for limit in (1, 7, 50, 100):
        walked = _walk(client, limit)
        assert len(walked) == len(set(walked)) == len(ids), limit
        assert set(walked) == set(ids)
    newest = [rid for i, rid in enumerate(ids) if i % 3]
    assert _walk(client, 7)[:len(newest)] == sorted(newest, reverse=True)


def test_letters_added_or_deleted_during_a_walk_shift_nothing_else(
        client: Client, redis_url: str, r: redis.Redis) -> None:
    ids = _dead_letters(client, redis_url, 150)
    _tie(r, ids, [TIE_MS, TIE_MS + 1])
    rng = random.Random(7)
    deleted: set[str] = set()
    pool = list(ids)

    def churn(page_no: int) -> None:
        # delete two letters (some ahead of the walk, some behind, maybe the cursor's own) and
        # move one letter's twin ahead of the walk: a letter newer than every other
        for rid in rng.sample([x for x in pool if x not in deleted], 2):
            r.zrem(keys.dead(partition_of(job_of_run(rid))), rid)
            deleted.add(rid)
        r.zadd(keys.dead(0), {f"0-new{page_no}@1": TIE_MS + 5})

    walked = _walk(client, 9, churn)
    assert len(walked) == len(set(walked))
    assert set(ids) - deleted <= set(walked)


def test_a_cursor_whose_letter_is_gone_finds_its_place_among_thousands_of_ties(
        client: Client, r: redis.Redis) -> None:
    members = [f"{i:05d}-{random.Random(i).random():.6f}@1" for i in range(5000)]
    r.zadd(keys.dead(0), dict.fromkeys(members, TIE_MS))
    r.zadd(keys.dead(0), {"older@1": TIE_MS - 1, "newer@1": TIE_MS + 1})
    parts = client.run(client.op_partitions())
    order = [("newer@1", TIE_MS + 1), *((m, TIE_MS) for m in sorted(members, reverse=True)),
             ("older@1", TIE_MS - 1)]
    for at in (0, 1, 2, 2500, 4999, 5000):
        rid, score = order[at]
        r.zrem(keys.dead(0), rid)
        got = client.run(op_dead_after(parts, (float(score), rid), None, 3))
        assert [x for x, _ in got] == [x for x, _ in order[at + 1 : at + 4]], at
        r.zadd(keys.dead(0), {rid: score})


def test_attempts_finishing_during_a_walk_of_a_jobs_runs_shift_nothing(
        client: Client, redis_url: str) -> None:
    job = client.schedule("fine", {}, run_at=LATER)

    async def run_triggered(n: int) -> None:
        async with Rig(redis_url, _boom_app()) as rig:
            for _ in range(n):
                client.trigger(job.id)
                for _ in range(20):
                    await rig.cycle()
                    if client.run(op_redis_runs_page(job.id, 1)).items[0].status not in (
                            "dispatched", "running"):
                        break

    asyncio.run(run_triggered(5))
    before = [a.run_id for a in client.run(op_redis_runs_page(job.id, 100)).items]
    assert len(before) == len(set(before)) == 5
    walked: list[str] = []
    cursor = None
    while True:
        page = client.run(op_redis_runs_page(job.id, 1, cursor))
        walked += [a.run_id for a in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        asyncio.run(run_triggered(1))  # a newer attempt finishes: it must shift nothing
    assert walked == before
