"""The archive's job index: the archiver keeps one row per job (read from Redis per batch,
applied once per event), and filtered, searched or sorted listings page through it and re-read
the jobs from Redis; without an archive, listings scan and say so.  Real redis-server, SQLite
and Postgres (support.archive), real engine loops for the latest runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient
from support.archive import archive_url, emit, store  # noqa: F401 - the two-store fixtures
from support.helpers import Rig, settings

from rsched import App, JobContext
from rsched.api.app import create_app
from rsched.archive import Archiver, ArchiverConfig, Store
from rsched.archive import store as store_module
from rsched.archive.job_index import NO_NEXT_MS
from rsched.cli.main import cli
from rsched.client import Client
from rsched.core.errors import ValidationError
from rsched.core.last_run import LastRun
from rsched.core.models import Job, partition_of
from rsched.rdb import keys
from rsched.service.job_listing import JobFilter, op_job_listing
from rsched.service.last_runs import op_last_runs

LATER_MS = 1_893_456_000_000  # 2030-01-01


def _app() -> App:
    app = App("job-index-test")

    def handler(ctx: JobContext) -> str:
        if ctx.payload and ctx.payload.get("fail"):
            raise RuntimeError("failed on purpose")
        return "fine"

    app.job("common")(handler)
    app.job("rare")(handler)
    return app


@pytest.fixture
def indexed(redis_url: str, archive_url: str) -> Iterator[Client]:  # noqa: F811
    c = Client(settings=settings(redis_url), archive_url=archive_url)
    try:
        yield c
    finally:
        c.close()


def archive_all(r: redis.Redis, store: Store, partitions: int) -> Archiver:  # noqa: F811
    """An archiver that applied every event waiting in Redis."""
    a = Archiver(r, store, partitions, ArchiverConfig(batch=50))
    a.setup()
    while a.run_once().read:
        pass
    return a


def walk(c: Client, flt: JobFilter, sort: str | None, limit: int) -> list[list[Job]]:
    """Every page of the listing, checking each is full but the last."""
    pages, cursor = [], None
    for _ in range(1000):
        page = c.run(op_job_listing(c, flt, sort=sort, limit=limit, cursor=cursor))
        assert page.indexed and page.sort == (sort or "created")
        pages.append(page.jobs)
        cursor = page.next_cursor
        if cursor is None:
            break
        assert len(page.jobs) == limit, "a page before the last is full"
    return pages


def current(c: Client, ids: list[str]) -> dict[str, tuple[Job, LastRun]]:
    jobs = [c.get(j) for j in ids]
    return {j.id: (j, lr) for j, lr in zip(jobs, c.run(op_last_runs(jobs)), strict=True)}


def sort_key(sort: str, job: Job, last: LastRun) -> tuple[int, str]:
    key = {"nextRun": job.next_ms or NO_NEXT_MS, "created": job.created_ms,
           "lastRun": last.at_ms or 0}[sort]
    return key, job.id


def _make_jobs(c: Client, r: redis.Redis, redis_url: str) -> list[str]:
    """36 jobs: types, queues, statuses, idempotency keys and latest runs of every kind, with
    next runs that tie (the job id breaks ties)."""
    ids = []
    for i in range(36):
        job = c.schedule("rare" if i % 9 == 0 else "common", {"fail": i % 4 == 1},
                         run_at=LATER_MS + (i % 5) * 60_000, queue="bulk" if i % 3 else "default",
                         idempotency_key=f"order-{i:03d}" if i % 2 else None, max_attempts=1)
        ids.append(job.id)
    for i in (2, 11, 20):
        c.pause(ids[i])
    c.cancel(ids[7])
    ran = [ids[i] for i in (0, 1, 5, 9, 13, 18, 27)]
    for job_id in ran:
        c.trigger(job_id)

    async def settle() -> None:
        async with Rig(redis_url, _app(), worker_kw={"queues": ["default", "bulk"]}) as rig:
            for _ in range(20):
                await rig.cycle()
                if all(lr.status in ("succeeded", "dead")
                       for _, lr in current(c, ran).values()):
                    return
        states = [(j.id, lr.status) for j, lr in current(c, ran).values()]
        raise AssertionError(f"triggered runs did not finish in 20 engine cycles: {states}")

    asyncio.run(settle())
    return ids


FILTERS = [JobFilter(), JobFilter(type="rare"), JobFilter(queue="default"),
           JobFilter(status="paused"), JobFilter(status="scheduled", type="common"),
           JobFilter(last_run="failed"), JobFilter(last_run="succeeded"),
           JobFilter(last_run="dead"), JobFilter(q="order-01"), JobFilter(q="rar"),
           JobFilter(type="nothing-like-it")]


def test_every_filter_and_sort_walks_each_matching_job_once_in_order(
    indexed: Client, r: redis.Redis, redis_url: str, store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _make_jobs(indexed, r, redis_url)
    archive_all(r, store, indexed.partitions)
    now = current(indexed, ids)
    assert {lr.status for _, lr in now.values()} >= {"succeeded", "dead", None}
    # Both plans of a filter sorted by next or last run: its matches sorted (few match), and
    # the sort's index walked (many match: more than PLAN_ROWS).
    for plan_rows in (20_000, 2):
        monkeypatch.setattr(store_module, "PLAN_ROWS", plan_rows)
        for flt in FILTERS:
            for sort in ("nextRun", "created", "lastRun"):
                want = sorted((sort_key(sort, j, lr) for j, lr in now.values()
                               if flt.matches(j, lr)), reverse=sort != "nextRun")
                for limit in (1, 4, 50):
                    got = [j.id for page in walk(indexed, flt, sort, limit) for j in page]
                    assert got == [job_id for _, job_id in want], (flt, sort, limit, plan_rows)
    # The default sort is creation, newest first (the job id breaking ties); a search also
    # matches idempotency keys.
    found = [j for page in walk(indexed, JobFilter(q="order-01"), None, 2) for j in page]
    assert sorted(j.idempotency_key or "" for j in found) == [
        f"order-{i:03d}" for i in (11, 13, 15, 17, 19)]
    assert [(j.created_ms, j.id) for j in found] == sorted(
        ((j.created_ms, j.id) for j in found), reverse=True)


def test_a_rare_filters_first_page_is_full_and_the_walk_takes_one_request_a_page(
    indexed: Client, r: redis.Redis, store: Store  # noqa: F811
) -> None:
    for i in range(300):
        indexed.schedule("rare" if i % 25 == 7 else "common", run_at=LATER_MS + i)
    archive_all(r, store, indexed.partitions)
    pages = walk(indexed, JobFilter(type="rare"), "nextRun", 5)
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [j.run_at_ms for p in pages for j in p] == [LATER_MS + i for i in range(7, 300, 25)]
    none = indexed.run(op_job_listing(indexed, JobFilter(type="nothing"), limit=50))
    assert none.jobs == [] and none.next_cursor is None


def test_a_redelivered_batch_changes_nothing(
    indexed: Client, r: redis.Redis, store: Store  # noqa: F811
) -> None:
    job = indexed.schedule("common", run_at=LATER_MS)
    first = Archiver(r, store, indexed.partitions, ArchiverConfig(), consumer="a1")
    first.setup()
    batch = first.read()
    first.commit(batch)  # killed before its XACK: the batch stays pending
    row = store.fetchall("SELECT * FROM jobs")
    assert [(x[0], x[4]) for x in row] == [(job.id, "scheduled")]
    indexed.pause(job.id)
    later = first.read()  # the 'paused' event, applied
    first.commit(later)
    paused = store.fetchall("SELECT * FROM jobs")
    assert [x[4] for x in paused] == ["paused"]
    indexed.resume(job.id)  # Redis moves on; its event is not archived yet
    # A restart under the same id reads its pending entries again: both batches, redelivered.
    again = Archiver(r, store, indexed.partitions, ArchiverConfig(), consumer="a1")
    redelivered = again.read()
    assert redelivered.size == batch.size + later.size
    again.commit(redelivered)
    assert store.fetchall("SELECT * FROM jobs") == paused  # not rolled forward nor back
    assert store.fetchall("SELECT count(*) FROM events") == [(batch.size + later.size,)]
    again.streams.ack(redelivered)
    while again.run_once().read:  # the 'resumed' event
        pass
    assert [x[4] for x in store.fetchall("SELECT * FROM jobs")] == ["scheduled"]


def test_jobs_changed_or_gone_in_redis_are_left_out_and_pages_stay_full(
    indexed: Client, r: redis.Redis, store: Store  # noqa: F811
) -> None:
    ids = [indexed.schedule("common", run_at=LATER_MS + i).id for i in range(12)]
    archive_all(r, store, indexed.partitions)
    for i in (1, 2, 3, 6):
        indexed.pause(ids[i])  # not archived yet: the index still says scheduled
    r.delete(keys.job(partition_of(ids[4]), ids[4]))  # expired: no event says so
    pages = walk(indexed, JobFilter(status="scheduled"), "nextRun", 3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [j.id for p in pages for j in p] == [ids[i] for i in (0, 5, 7, 8, 9, 10, 11)]
    # Not yet in the index as paused: listed once the archiver applied the events.
    paused = JobFilter(status="paused")
    assert walk(indexed, paused, "nextRun", 10) == [[]]
    emit(r, ids[4], "fenced")  # any later event of the gone job deletes its row
    archive_all(r, store, indexed.partitions)
    assert [j.id for p in walk(indexed, paused, "nextRun", 10) for j in p] == [
        ids[i] for i in (1, 2, 3, 6)]
    assert store.fetchall("SELECT count(*) FROM jobs WHERE job_id = ?", [ids[4]]) == [(0,)]


def test_the_api_and_the_cli_answer_from_the_index_and_say_until_when(
    indexed: Client, r: redis.Redis, redis_url: str, archive_url: str,  # noqa: F811
    store: Store, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    ids = [indexed.schedule("rare" if i % 4 == 0 else "common", run_at=LATER_MS - i,
                            idempotency_key=f"k-{i}").id for i in range(12)]
    archive_all(r, store, indexed.partitions)
    with TestClient(create_app(settings(redis_url), auth=False, archive_url=archive_url)) as api:
        seen: list[str] = []
        cursor = None
        while True:
            res = api.get("/jobs", params={"type": "rare", "sort": "nextRun", "limit": 2,
                                           **({"cursor": cursor} if cursor else {})})
            assert res.status_code == 200, res.text
            body = res.json()
            assert body["indexed"] is True and body["sort"] == "nextRun"
            assert body["indexedUntil"].endswith("Z")
            seen += [j["id"] for j in body["jobs"]]
            cursor = body["nextCursor"]
            if not cursor:
                break
        assert seen == [ids[i] for i in (8, 4, 0)]
        found = api.get("/jobs", params={"q": "k-1"}).json()
        assert sorted(j["idempotencyKey"] for j in found["jobs"]) == ["k-1", "k-10", "k-11"]
        for params, field in (({"sort": "name"}, "sort"), ({"q": "x" * 201}, "q"),
                              ({"type": "rare", "cursor": "bm9wZQ"}, "cursor")):
            res = api.get("/jobs", params=params)
            assert res.status_code == 422 and res.json()["errors"][0]["field"] == field
    monkeypatch.setenv("RSCHED_ARCHIVE_URL", archive_url)
    out = CliRunner().invoke(cli, ["--redis-url", redis_url, "--log-level", "ERROR", "jobs",
                                   "list", "--search", "k-1", "--sort", "created", "--json"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert [j["idempotencyKey"] for j in json.loads(out.stdout)["jobs"]] == ["k-11", "k-10",
                                                                             "k-1"]
    table = CliRunner().invoke(cli, ["--redis-url", redis_url, "jobs", "list", "--type", "rare",
                                     "--limit", "2"], catch_exceptions=False)
    assert "indexed until" in table.stderr
    assert "more: rsched jobs list --type rare --cursor" in table.stderr


def test_without_an_archive_listings_scan_and_say_so(
    client: Client, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RSCHED_ARCHIVE_URL", raising=False)
    job = client.schedule("rare", run_at=LATER_MS)
    page = client.run(op_job_listing(client, JobFilter(type="rare"), sort="nextRun"))
    assert not page.indexed and page.sort is None and page.indexed_until_ms is None
    assert [j.id for j in page.jobs] == [job.id]
    with pytest.raises(ValidationError) as e:
        client.run(op_job_listing(client, JobFilter(q="ra")))
    assert e.value.field == "q"
    with TestClient(create_app(settings(redis_url), auth=False)) as api:
        body: dict[str, Any] = api.get("/jobs", params={"type": "rare"}).json()
        assert body["indexed"] is False and body["indexedUntil"] is None
        assert api.get("/jobs", params={"q": "ra"}).status_code == 422
    out = CliRunner().invoke(cli, ["--redis-url", redis_url, "jobs", "list", "--type", "rare"],
                             catch_exceptions=False)
    assert out.exit_code == 0 and job.id in out.stdout
    assert "no run-history archive" in out.stderr
    plain = CliRunner().invoke(cli, ["--redis-url", redis_url, "jobs", "list"],
                               catch_exceptions=False)
    assert "no run-history archive" not in plain.stderr  # an unfiltered list is no fallback


def test_jobs_no_event_named_are_scanned_in_and_gone_ones_swept_out(
    indexed: Client, r: redis.Redis, store: Store  # noqa: F811
) -> None:
    ids = [indexed.schedule("common", run_at=LATER_MS + i).id for i in range(30)]
    for p in range(indexed.partitions):  # events trimmed before any archiver read them
        r.delete(keys.events(p))
    a = Archiver(r, store, indexed.partitions, ArchiverConfig())
    a.setup()
    assert store.fetchall("SELECT count(*) FROM jobs") == [(0,)]
    for _ in range(100):
        a.index_once()
        if store.job_index_mark("scanned_ms") is not None:
            break
    assert sorted(j for (j,) in store.fetchall("SELECT job_id FROM jobs")) == sorted(ids)
    assert [j.id for p in walk(indexed, JobFilter(type="common"), "nextRun", 7) for j in p] == ids
    indexed.pause(ids[3])  # an event replaces a scanned row
    while a.run_once().read:
        pass
    assert [j.id for p in walk(indexed, JobFilter(status="paused"), None, 7) for j in p] == [ids[3]]
    for job_id in ids[:5]:  # expired: no event says so
        r.delete(keys.job(partition_of(job_id), job_id))
    a.index_once()
    assert sorted(j for (j,) in store.fetchall("SELECT job_id FROM jobs")) == sorted(ids[5:])
    again = Archiver(r, store, indexed.partitions, ArchiverConfig())
    again.index_once()  # the scan ran once for this archive: a new archiver sweeps
    assert again.totals["index_scanned"] == 0


def test_an_unreachable_archive_answers_503_naming_it(redis_url: str, tmp_path: Path) -> None:
    gone = f"sqlite:///{tmp_path}/no/such/dir/archive.db"
    with TestClient(create_app(settings(redis_url), auth=False, archive_url=gone)) as api:
        res = api.get("/jobs", params={"type": "rare"})
        assert res.status_code == 503 and "archive is unavailable" in res.json()["detail"]
