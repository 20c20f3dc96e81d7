"""Dedup windows on create (docs/dedup.md) against the real session redis-server: each mode,
its window's end, batches, idempotency keys beside it, and every face (API, Python clients,
CLI)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.cli import as_json, ok, run_main
from support.helpers import all_jobs, problem_of, run_engine, settings, xrange

from rsched import App, AsyncClient, Client, Conflict, Dedup, JobContext, JobSpec, JobStatus
from rsched.api.app import create_app
from rsched.core import defaults
from rsched.core.ids import dedup_partition
from rsched.core.models import Job, partition_of
from rsched.rdb import keys, ops
from rsched.rdb.ops import Scripts
from rsched.service import scheduling

LATER = "2030-01-01T00:00:00Z"
WAIT_S = 10  # far beyond the short windows below: a loaded machine is slow, never early


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings(redis_url), auth=False)) as client:
        yield client


def _eventually(check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """``check()``'s first truthy value, polled until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.02)
    return value


def _record_ttl_ms(r: redis.Redis, key: str, partitions: int) -> int:
    return int(r.pttl(keys.dedup(dedup_partition(key, partitions), key)))


# --- ttl ------------------------------------------------------------------------------------


def test_ttl_answers_the_first_job_whatever_the_body_then_a_new_one_once_the_window_ends(
    client: Client, r: redis.Redis
) -> None:
    window = Dedup("report-7", 300, "ttl")
    first = client.schedule("report", {"n": 1}, run_at=client.now_ms() + 60_000, dedup=window)
    again = client.schedule("other", {"n": 2}, queue="q2", dedup=window)
    assert (again.id, again.type, again.payload, again.deduplicated) == (
        first.id, "report", {"n": 1}, True)
    assert first.deduplicated is False
    assert partition_of(first.id) == dedup_partition("report-7", client.partitions)
    assert 0 < _record_ttl_ms(r, "report-7", client.partitions) <= 300
    later = _eventually(lambda: (j := client.schedule("report", 3, dedup=window)).id != first.id
                        and j)
    assert later.deduplicated is False and later.payload == 3
    assert client.get(first.id).payload == {"n": 1}  # the first job is left as it was


def test_ttl_answers_the_first_job_even_once_it_has_ended(client: Client) -> None:
    window = Dedup("once-a-minute", 60_000)
    first = client.schedule("t", run_at=client.now_ms() + 60_000, dedup=window)
    client.cancel(first.id)
    again = client.schedule("t", dedup=window)
    assert (again.id, again.status, again.deduplicated) == (first.id, JobStatus.CANCELLED, True)


def test_the_api_answers_201_then_200_with_the_first_job_marked_deduplicated(
    api: TestClient
) -> None:
    body = {"type": "t", "runAt": LATER, "dedup": {"key": "k", "ttlSeconds": 60}}
    created = api.post("/jobs", json=body)
    assert created.status_code == 201 and created.json()["deduplicated"] is False
    job_id = created.json()["id"]
    again = api.post("/jobs", json={"type": "t", "payload": 2, "dedup": body["dedup"]})
    assert again.status_code == 200, again.text
    assert again.json()["id"] == job_id and again.json()["deduplicated"] is True
    assert again.headers["location"] == f"/jobs/{job_id}"
    assert "deduplicated" not in api.get(f"/jobs/{job_id}").json()


def test_a_bad_dedup_window_is_a_422_naming_the_field_and_stores_nothing(
    api: TestClient, r: redis.Redis
) -> None:
    for dedup, field in (({"key": "", "ttlSeconds": 5}, "dedup.key"),
                         ({"key": "k" * 201, "ttlSeconds": 5}, "dedup.key"),
                         ({"key": "a\tb", "ttlSeconds": 5}, "dedup.key"),
                         ({"key": "k", "ttlSeconds": 0}, "dedup.ttlSeconds"),
                         ({"key": "k", "ttlSeconds": 2592001}, "dedup.ttlSeconds"),
                         ({"key": "k", "ttlSeconds": 5, "mode": "sometimes"}, "dedup.mode")):
        problem_of(api.post("/jobs", json={"type": "t", "dedup": dedup}), 422, field)
    problem_of(api.post("/jobs", json={"type": "t", "cron": "* * * * *", "dedup": {
        "key": "k", "ttlSeconds": 5, "mode": "debounce"}}), 422, "cron")
    results = api.post("/jobs/batch", json={"jobs": [
        {"type": "t", "dedup": {"key": "k", "ttlSeconds": -1}}]}).json()["results"]
    assert results[0]["status"] == 422
    assert results[0]["error"]["errors"][0]["field"] == "jobs[0].dedup.ttlSeconds"
    assert r.keys("rsched:{p*") == []  # no job, record or event in any partition


# --- untilDone ------------------------------------------------------------------------------


def test_until_done_holds_while_the_job_has_not_ended_and_its_cancel_ends_it(
    client: Client
) -> None:
    window = Dedup("sync-9", 60_000, "untilDone")
    first = client.schedule("sync", run_at=client.now_ms() + 60_000, dedup=window)
    client.pause(first.id)  # paused has not ended
    assert client.schedule("sync", dedup=window).id == first.id
    client.resume(first.id)
    assert client.schedule("sync", dedup=window).deduplicated
    client.cancel(first.id)
    after = client.schedule("sync", dedup=window)
    assert after.id != first.id and not after.deduplicated
    assert client.schedule("sync", dedup=window).id == after.id


def test_until_done_holds_no_longer_than_its_ttl(client: Client) -> None:
    window = Dedup("slow", 300, "untilDone")
    first = client.schedule("t", run_at=client.now_ms() + 3_600_000, dedup=window)
    later = _eventually(lambda: (j := client.schedule("t", dedup=window)).id != first.id and j)
    assert client.get(first.id).status is JobStatus.SCHEDULED and not later.deduplicated


def test_until_done_ends_when_the_job_completes_or_is_dead_lettered(
    redis_url: str, client: Client
) -> None:
    app = App("dedup")
    app.job("ok")(lambda ctx: None)

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError("no")

    ok_window, dead_window = Dedup("ok", 60_000, "untilDone"), Dedup("dead", 60_000, "untilDone")
    done = client.schedule("ok", dedup=ok_window)
    dead = client.schedule("boom", dedup=dead_window, max_attempts=1)
    assert client.schedule("ok", dedup=ok_window).id == done.id

    def ended() -> bool:
        return {client.get(done.id).status, client.get(dead.id).status} == {
            JobStatus.COMPLETED, JobStatus.DEAD}

    asyncio.run(run_engine(redis_url, app, ended))
    for window, old in ((ok_window, done), (dead_window, dead)):
        new = client.schedule(old.type, dedup=window)
        assert new.id != old.id and not new.deduplicated


# --- debounce ---------------------------------------------------------------------------------


def test_debounce_runs_the_job_once_its_ttl_after_the_last_create_with_that_ones_payload(
    redis_url: str, client: Client
) -> None:
    window = Dedup("reindex", 400, "debounce")
    ran: list[tuple[Any, int]] = []
    app = App("debounce")

    @app.job("reindex")
    def reindex(ctx: JobContext) -> None:
        ran.append((ctx.payload, client.now_ms()))

    async def creates() -> None:
        for n in range(3):
            stamps.append(client.now_ms())  # Redis's clock before the create
            jobs.append(client.schedule("reindex", {"n": n}, dedup=window))
            await asyncio.sleep(0.15)  # within the window: each moves the job

    jobs: list[Job] = []
    stamps: list[int] = []
    asyncio.run(run_engine(redis_url, app, lambda: bool(ran), while_running=creates))
    assert len({j.id for j in jobs}) == 1 and [j.deduplicated for j in jobs] == [
        False, True, True]
    assert jobs[2].payload == {"n": 2} and jobs[2].version == 3
    assert jobs[2].next_ms is not None and jobs[2].next_ms >= stamps[2] + 400
    (payload, at), = ran
    assert payload == {"n": 2} and at >= stamps[2] + 400  # not before ttl after the last
    time.sleep(0.3)
    assert len(ran) == 1  # once
    again = client.schedule("reindex", {"n": 3}, dedup=window)
    assert again.id != jobs[0].id and not again.deduplicated


def test_each_debounced_create_is_an_updated_event_after_the_jobs_scheduled_one(
    client: Client, r: redis.Redis
) -> None:
    window = Dedup("burst", 60_000, "debounce")
    jobs = all_jobs(client.schedule_many([JobSpec("t", n, dedup=window) for n in range(3)]))
    later = client.schedule("t", 3, dedup=window)
    job_id = jobs[0].id
    events = [(f[b"e"], f[b"j"]) for _, f in xrange(r, keys.events(partition_of(job_id)))]
    assert events == [(b"scheduled", job_id.encode())] + [(b"updated", job_id.encode())] * 3
    assert later.id == job_id and client.get(job_id).version == 4


def test_debounce_moves_only_a_job_still_waiting(client: Client) -> None:
    window = Dedup("d", 60_000, "debounce")
    first = client.schedule("t", 1, dedup=window)
    assert first.next_ms is not None and first.next_ms >= client.now_ms() + 59_000
    client.cancel(first.id)  # left the due set: the next create makes a job of its own
    second = client.schedule("t", 2, dedup=window)
    assert second.id != first.id and second.payload == 2


# --- batches and idempotency keys -----------------------------------------------------------


def test_a_batch_with_one_key_many_times_creates_one_job_per_key(
    client: Client, api: TestClient
) -> None:
    a, b = Dedup("a", 60_000), Dedup("b", 60_000, "untilDone")
    specs = [JobSpec("t", n, dedup=[a, b, None][n % 3]) for n in range(9)]
    jobs = all_jobs(client.schedule_many(specs))
    assert {j.id for j in jobs[0::3]} == {jobs[0].id} and {j.id for j in jobs[1::3]} == {jobs[1].id}
    assert len({j.id for j in jobs[2::3]}) == 3 and jobs[0].id != jobs[1].id
    assert [j.deduplicated for j in jobs] == [n >= 3 and n % 3 != 2 for n in range(9)]
    results = api.post("/jobs/batch", json={"jobs": [
        {"type": "t", "dedup": {"key": "c", "ttlSeconds": 60}}] * 3}).json()["results"]
    assert [x["status"] for x in results] == [201, 200, 200]
    assert [x["job"]["deduplicated"] for x in results] == [False, True, True]
    assert len({x["job"]["id"] for x in results}) == 1


def test_a_batch_of_one_key_spanning_many_script_calls_still_creates_one_job(
    client: Client
) -> None:
    """Calls after the first find the record naming a job they did not carry: each is sent
    again with it."""
    n = 2 * defaults.SCHEDULE_CHUNK + 10
    window = Dedup("many", 60_000)
    keyed = [JobSpec("t", i, dedup=window, idempotency_key=f"i{i}") for i in range(5)]
    jobs = all_jobs(client.schedule_many([JobSpec("t", i, dedup=window) for i in range(n)]
                                         + keyed))
    assert {j.id for j in jobs} == {jobs[0].id}
    assert sum(not j.deduplicated for j in jobs) == 1


def test_an_idempotency_key_beside_a_dedup_window(client: Client) -> None:
    window = Dedup("w", 60_000, "untilDone")
    first = client.schedule("t", 1, idempotency_key="i1", dedup=window)
    replay = client.run(client.op_schedule_created([JobSpec("t", 1, idempotency_key="i1",
                                                            dedup=window)]))[0]
    assert isinstance(replay, tuple) and replay[0].id == first.id
    assert (replay[1], replay[0].deduplicated) == (False, False)  # a replay, not the window
    other = client.schedule("t", 2, idempotency_key="i2", dedup=window)
    assert other.id == first.id and other.deduplicated
    with pytest.raises(Conflict) as e:
        client.schedule("t", 1, idempotency_key="i1", dedup=Dedup("w", 5_000, "untilDone"))
    assert e.value.field == "idempotencyKey"
    client.cancel(first.id)
    assert client.schedule("t", 2, idempotency_key="i2", dedup=window).id != first.id
    assert client.schedule("t", 2, idempotency_key="i2", dedup=window).deduplicated is False


def test_a_record_that_keeps_naming_other_jobs_ends_in_a_409_naming_dedup_key(
    client: Client, r: redis.Redis
) -> None:
    """Each call finds the record re-pointed (as by other creates in between): the client
    calls again with the job named, DEDUP_TRIES times, then gives up and creates nothing."""
    window = Dedup("contended", 60_000, "untilDone")
    first = client.schedule("t", dedup=window)
    p = partition_of(first.id)
    record = keys.dedup(p, "contended")
    op = scheduling.op_schedule_many(client, [JobSpec("t", dedup=window)])
    calls = 0
    work = next(op)
    try:
        while True:
            if isinstance(work, Scripts):
                calls += 1
                r.set(record, f"{p}-rival{calls}")
            work = op.send(ops.execute(client.r, work))
    except StopIteration as done:
        (answer,) = done.value
    assert isinstance(answer, Conflict) and answer.field == "dedup.key"
    assert calls == 1 + scheduling.DEDUP_TRIES
    assert r.keys(keys.job(p, "*")) == [keys.job(p, first.id).encode()]


# --- the other faces ------------------------------------------------------------------------


def test_the_async_client_answers_concurrent_creates_of_one_key_with_one_job(
    redis_url: str
) -> None:
    async def go() -> tuple[list[Job], tuple[Job, bool]]:
        c = AsyncClient(settings=settings(redis_url))
        try:
            window = Dedup("burst", 60_000, "debounce")
            jobs: list[Job] = list(await asyncio.gather(
                *(c.schedule("t", n, dedup=window) for n in range(10))))
            return jobs, await c.schedule_spec(JobSpec("t", 10, dedup=window))
        finally:
            await c.close()

    jobs, (last, created) = asyncio.run(go())
    assert len({j.id for j in jobs} | {last.id}) == 1
    assert sum(not j.deduplicated for j in jobs) == 1
    assert (created, last.deduplicated, last.payload) == (False, True, 10)


def test_jobs_add_takes_the_dedup_flags_and_names_them_in_errors(redis_url: str) -> None:
    flags = ["--dedup-key", "nightly", "--dedup-ttl", "60", "--dedup-mode", "untilDone"]
    job_id = ok(redis_url, "jobs", "add", "--type", "t", *flags).strip()
    assert ok(redis_url, "jobs", "add", "--type", "t", *flags).strip() == (
        f"{job_id} (deduplicated)")
    shown = as_json(redis_url, "jobs", "add", "--type", "t", *flags)
    assert (shown["id"], shown["deduplicated"]) == (job_id, True)
    for args, flag in ((["--dedup-key", "k", "--dedup-ttl", "5", "--dedup-mode", "x"],
                        "--dedup-mode"),
                       (["--dedup-key", "k", "--dedup-ttl", "0"], "--dedup-ttl"),
                       (["--dedup-ttl", "5"], "--dedup-key")):
        done = run_main(redis_url, "jobs", "add", "--type", "t", *args)
        assert done.returncode == 1 and done.stderr.startswith(f"error: {flag}:"), done.stderr
