"""Backfill (POST /jobs/{id}/backfill, Client.backfill, `rsched jobs backfill`): each occurrence
of a range runs once with its nominal time, whoever else ran or reaches it (a second backfill,
the dispatcher), under the overlap policy it is given (allow here, where runs may overlap; its
default bufferAll is in tests/redis/test_backfill_overlap.py); dry runs, the 10,000 limit, field
errors."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient
from support import fleet as fleet_support
from support.chaos_app import LOG
from support.cli import run_main
from support.fleet import Fleet, quiet, started, wait_for
from support.helpers import Rig, problem_of, settings

from rsched import App, Client, JobContext, RunState
from rsched.api.app import create_app
from rsched.cli.main import cli
from rsched.core.errors import NotReplicated, ValidationError
from rsched.core.models import Job
from rsched.core.times import ms_to_iso
from rsched.rdb import keys
from rsched.service.samples import SAMPLES_KEY

fleets, fleet = fleet_support.fleets, fleet_support.fleet  # fixtures
S = 1000


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings(redis_url), auth=False)) as c:
        yield c


def every_second(client: Client, **kw: Any) -> tuple[Job, int]:
    """A paused every-second job (its live schedule stays out of the way) and a whole second
    of Redis's clock at or before now."""
    job = client.schedule("record", cron="* * * * * *", paused=True, **kw)
    return job, client.now_ms() // S * S


def recording_app(log: list[tuple[str, int]]) -> App:
    app = App("backfill")

    @app.job("record")
    def record(ctx: JobContext) -> None:
        log.append((ctx.run_id, ctx.scheduled_ms))

    return app


async def run_all(rig: Rig, rounds: int = 200) -> None:
    """Claim, run and report until a round finds nothing to dispatch or start."""
    for _ in range(rounds):
        claimed, fetched, _ = await rig.cycle()
        if not claimed.dispatched and not fetched:
            return


def test_a_second_backfill_over_an_overlapping_range_runs_no_occurrence_twice(
    redis_url: str, client: Client
) -> None:
    job, now = every_second(client)
    first = client.backfill(job.id, now - 30 * S, now - 10 * S, overlap="allow")
    assert first.times == list(range(now - 30 * S, now - 10 * S, S))
    assert first.queued == first.times and not first.existing
    second = client.backfill(job.id, ms_to_iso(now - 20 * S), ms_to_iso(now - 5 * S),
                             overlap="allow")
    assert second.existing == list(range(now - 20 * S, now - 10 * S, S))
    assert second.queued == list(range(now - 10 * S, now - 5 * S, S))
    log: list[tuple[str, int]] = []

    async def scenario() -> None:
        async with Rig(redis_url, recording_app(log)) as rig:
            await run_all(rig)

    asyncio.run(scenario())
    assert sorted(log) == [(f"{job.id}@{t}", t) for t in range(now - 30 * S, now - 5 * S, S)]
    assert client.get_run(f"{job.id}@{now - 30 * S}").state is RunState.SUCCEEDED
    # Once they ran, a third backfill still finds every run.
    third = client.backfill(job.id, now - 40 * S, now - 5 * S, overlap="allow")
    assert third.existing == list(range(now - 30 * S, now - 5 * S, S))
    assert len(third.queued) == 10


def test_an_occurrence_a_backfill_ran_is_not_dispatched_again_when_the_dispatcher_reaches_it(
    redis_url: str, client: Client
) -> None:
    """The dispatcher is behind (as after an outage): the backfill runs the occurrences it has
    not claimed yet, and its claims then find their runs."""
    job = client.schedule("record", cron="* * * * * *")
    assert job.next_ms is not None
    time.sleep(3.2)
    now = client.now_ms()
    done = client.backfill(job.id, job.next_ms, now // S * S, overlap="allow")
    assert len(done.queued) >= 2 and not done.existing
    log: list[tuple[str, int]] = []

    async def scenario() -> None:
        async with Rig(redis_url, recording_app(log)) as rig:
            await run_all(rig)

    asyncio.run(scenario())
    runs = Counter(rid for rid, _ in log)
    assert all(n == 1 for n in runs.values()), runs
    assert {f"{job.id}@{t}" for t in done.queued} <= set(runs)


def test_a_backfill_over_occurrences_the_dispatcher_ran_runs_none_of_them_again(
    redis_url: str, client: Client
) -> None:
    job = client.schedule("record", cron="* * * * * *")
    assert job.next_ms is not None
    log: list[tuple[str, int]] = []

    async def scenario() -> None:
        async with Rig(redis_url, recording_app(log)) as rig:
            deadline = time.monotonic() + 10
            while len(log) < 3 and time.monotonic() < deadline:
                await rig.cycle()
                await asyncio.sleep(0.05)

    asyncio.run(scenario())
    ran = sorted(t for _, t in log)
    assert len(ran) >= 3
    res = client.backfill(job.id, ran[0] - 5 * S, ran[-1] + 1, overlap="allow")
    assert res.existing == ran
    assert res.queued == list(range(ran[0] - 5 * S, ran[0], S))  # before the job existed


def test_a_dry_run_says_what_each_time_would_become_and_writes_nothing(
    client: Client, r: redis.Redis, api: TestClient
) -> None:
    job, now = every_second(client)
    client.backfill(job.id, now - 2 * S, now - S, overlap="allow")  # one ran already

    def stored() -> dict[bytes, Any]:
        """Every key and its dump, but the overview samples the API's sampler may write."""
        return {k: r.dump(k) for k in cast(list[bytes], r.keys("*")) if k != SAMPLES_KEY.encode()}

    before = stored()
    res = api.post(f"/jobs/{job.id}/backfill", json={
        "from": ms_to_iso(now - 3 * S), "to": ms_to_iso(now), "dryRun": True,
        "overlap": "allow"})
    assert res.status_code == 200, res.text
    times = [ms_to_iso(now - k * S) for k in (3, 2, 1)]
    assert res.json() == {"jobId": job.id, "from": ms_to_iso(now - 3 * S), "to": ms_to_iso(now),
                          "dryRun": True, "overlap": "allow", "count": 3, "times": times,
                          "counts": {"queued": 2, "alreadyRun": 1, "skipped": 0, "buffered": 0},
                          "queued": [times[0], times[2]], "alreadyRun": [times[1]],
                          "skipped": [], "buffered": []}
    assert stored() == before
    real = api.post(f"/jobs/{job.id}/backfill", json={
        "from": ms_to_iso(now - 3 * S), "to": ms_to_iso(now), "overlap": "allow"}).json()
    assert {k: real[k] for k in ("counts", "queued", "alreadyRun")} == {
        k: res.json()[k] for k in ("counts", "queued", "alreadyRun")}
    assert real["dryRun"] is False


@pytest.mark.parametrize("overlap",
                         ["allow", "skip", "bufferOne", "cancelPrevious", "bufferAll"])
def test_a_dry_run_decides_each_occurrence_as_the_backfill_then_does(
    client: Client, r: redis.Redis, overlap: str
) -> None:
    """Over more occurrences than one script call takes (each chunk's decisions depend on the
    runs the previous chunk's made active or buffered), with some that ran and some recorded
    skipped."""
    job, now = every_second(client, overlap="allow" if overlap == "bufferAll" else overlap)
    start = now - 1200 * S
    client.backfill(job.id, start + 100 * S, start + 103 * S, overlap=overlap)
    # As if the runs that backfill started ended: a policy's first occurrence may run again.
    r.hset(keys.job(job.partition, job.id), mapping={"active": "", "buffered": "", "bq": "",
                                                     "bq_tail": ""})
    dry = client.backfill(job.id, start, now, dry_run=True, overlap=overlap)
    real = client.backfill(job.id, start, now, overlap=overlap)
    assert len(dry.times) == 1200
    assert (dry.queued, dry.existing, dry.skipped, dry.buffered) == (
        real.queued, real.existing, real.skipped, real.buffered)
    assert len(dry.existing) >= 1 and len(dry.queued) >= 1


def test_a_backfill_keeps_to_the_jobs_start_at_and_end_at(client: Client) -> None:
    now = client.now_ms() // S * S
    job = client.schedule("record", cron="* * * * * *", paused=True, start_at=now - 3 * S,
                          end_at=now + 60 * S)
    res = client.backfill(job.id, now - 6 * S, now, dry_run=True)
    assert res.times == [now - 3 * S, now - 2 * S, now - S]
    bounded = client.schedule("record", cron="* * * * * *", paused=True, end_at=now + 60 * S)
    late = client.backfill(bounded.id, now - 2 * S, now, dry_run=True)
    assert late.times == [now - 2 * S, now - S]


def test_at_most_10000_occurrences_a_call_and_more_is_a_422_naming_to(
    client: Client, api: TestClient
) -> None:
    job, now = every_second(client)
    start = now - 20_000 * S
    res = client.backfill(job.id, start, start + 10_000 * S)  # bufferAll: 20 chunks in a row
    assert (len(res.queued), len(res.buffered)) == (1, 9_999)
    dry = client.backfill(job.id, start, start + 10_000 * S, dry_run=True)  # 20 chunks
    assert len(dry.existing) == 10_000
    body = problem_of(api.post(f"/jobs/{job.id}/backfill", json={
        "from": ms_to_iso(start), "to": ms_to_iso(start + 10_000 * S + 1), "dryRun": True}),
        422, "to")
    assert "10,000" in body["detail"]


@pytest.mark.parametrize(("body", "field"), [
    ({"from": "2026-01-01T00:00:10Z", "to": "2026-01-01T00:00:10Z"}, "from"),
    ({"from": "2026-01-01T00:00:10Z", "to": "2026-01-01T00:00:00Z"}, "from"),
    ({"from": "yesterday", "to": "2026-01-01T00:00:00Z"}, "from"),
    ({"from": "2026-01-01T00:00:00", "to": "2026-01-02T00:00:00Z"}, "from"),
    ({"from": "2026-01-01T00:00:00Z"}, "to"),
    ({"from": "2026-01-01T00:00:00Z", "to": 5}, "to"),
    ({"from": "2026-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z"}, "to"),
    ({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:01:00Z", "dryRun": "yes"}, "dryRun"),
    ({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:01:00Z", "until": 1}, "until"),
])
def test_bad_input_is_a_422_naming_the_field(
    client: Client, api: TestClient, body: dict[str, Any], field: str
) -> None:
    job, _ = every_second(client)
    problem_of(api.post(f"/jobs/{job.id}/backfill", json=body), 422, field)


def test_a_one_off_job_a_cancelled_or_unknown_one_cannot_be_backfilled(
    client: Client, api: TestClient
) -> None:
    body = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:01:00Z"}
    one_off = client.schedule("record", run_at="2030-01-01T00:00:00Z")
    assert "one-off" in problem_of(api.post(f"/jobs/{one_off.id}/backfill", json=body),
                                   422, "id")["detail"]
    job, _ = every_second(client)
    client.cancel(job.id)
    problem_of(api.post(f"/jobs/{job.id}/backfill", json=body), 409, "status")
    assert api.post("/jobs/0-nosuchjob/backfill", json=body).status_code == 404


def test_a_range_whose_run_records_may_have_expired_is_refused(redis_url: str) -> None:
    """After the job's creation and longer ago than the run TTL, the dispatcher may have run an
    occurrence whose hash is gone: refused, not guessed."""
    with Client(settings=settings(redis_url, run_ttl_ms=3_000)) as c:
        job = c.schedule("record", cron="* * * * * *")
        time.sleep(4.5)
        now = c.now_ms() // S * S
        with pytest.raises(ValidationError) as e:
            c.backfill(job.id, job.created_ms - 3 * S, now)
        assert e.value.field == "from" and "RSCHED_RUN_TTL_MS" in e.value.reason
        with pytest.raises(ValidationError):  # a dry run says so too, before a confirmation
            c.backfill(job.id, job.created_ms - 3 * S, now, dry_run=True)
        assert len(c.backfill(job.id, now - 2 * S, now).times) == 2  # inside the TTL: fine
        assert len(c.backfill(job.id, job.created_ms - 3 * S, job.created_ms).times) == 3


def test_under_skip_and_buffer_one_a_backfill_runs_what_the_policy_lets_run(
    client: Client
) -> None:
    skip, now = every_second(client, overlap="skip")
    res = client.backfill(skip.id, now - 3 * S, now, overlap="skip")
    assert (len(res.queued), len(res.skipped)) == (1, 2)
    assert client.get_run(f"{skip.id}@{now - 2 * S}").error == (
        f"overlap: run {skip.id}@{now - 3 * S} of this job is still active")
    buffer_one, _ = every_second(client, overlap="bufferOne")
    res = client.backfill(buffer_one.id, now - 3 * S, now, overlap="bufferOne")
    assert [len(res.queued), len(res.buffered), len(res.skipped)] == [1, 1, 1]
    assert client.get_run(f"{buffer_one.id}@{now - 2 * S}").state is RunState.BUFFERED


def test_the_cli_backfills_and_names_its_flags(redis_url: str, client: Client) -> None:
    job, now = every_second(client, overlap="skip")
    base = ["--redis-url", redis_url, "--log-level", "ERROR", "jobs", "backfill", job.id,
            "--overlap", "skip"]
    rng = ["--from", ms_to_iso(now - 3 * S) or "", "--to", ms_to_iso(now) or ""]
    client.backfill(job.id, now - 3 * S, now - 2 * S, overlap="skip")  # the job's active run
    dry = CliRunner().invoke(cli, [*base, *rng, "--dry-run"], catch_exceptions=False)
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines() == [
        f"{ms_to_iso(now - 3 * S)}  already ran",
        f"{ms_to_iso(now - 2 * S)}  would be skipped by overlap",
        f"{ms_to_iso(now - S)}  would be skipped by overlap",
        f"3 occurrence(s) in [{rng[1]}, {rng[3]}): 0 would be queued, 1 already ran, "
        "2 skipped by overlap",
        "dry run: nothing written; run it without --dry-run to do it"]
    dry_json = json.loads(CliRunner().invoke(cli, [*base, *rng, "--dry-run", "--json"],
                                             catch_exceptions=False).stdout)
    assert dry_json["counts"] == {"queued": 0, "alreadyRun": 1, "skipped": 2, "buffered": 0}
    real = CliRunner().invoke(cli, [*base, *rng, "--json"], catch_exceptions=False)
    assert json.loads(real.stdout)["skipped"] == [ms_to_iso(now - 2 * S), ms_to_iso(now - S)]
    again = CliRunner().invoke(cli, [*base, *rng], catch_exceptions=False)
    assert again.stdout.strip().endswith(": 0 queued, 1 already ran, 2 skipped by overlap")
    bad = CliRunner().invoke(cli, [*base, "--from", "soon", "--to", rng[3]])
    assert isinstance(bad.exception, ValidationError) and bad.exception.field == "--from"


def test_the_real_cli_dry_run_counts_and_writes_nothing_and_then_the_backfill_does_so(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    """The installed entry point in a process of its own: an hour of an every-10-seconds job
    (the 360 runs a click used to queue) is counted first."""
    job = client.schedule("record", cron="*/10 * * * * *", paused=True)
    end = client.now_ms() // (10 * S) * (10 * S)
    rng = ["--from", ms_to_iso(end - 3600 * S) or "", "--to", ms_to_iso(end) or ""]
    before = r.dbsize()
    dry = run_main(redis_url, "jobs", "backfill", job.id, *rng, "--dry-run", "--overlap",
                   "allow")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert len(lines) == 362 and all(x.endswith("  would be queued") for x in lines[:360])
    assert lines[360].endswith(": 360 would be queued, 0 already ran")
    assert r.dbsize() == before and not client.runs(job.id)
    done = run_main(redis_url, "jobs", "backfill", job.id, *rng, "--overlap", "allow")
    assert done.stdout.strip().endswith(": 360 queued, 0 already ran"), done.stderr


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_processes_run_each_backfilled_occurrence_once(
    r: redis.Redis, fleet: Fleet, client: Client
) -> None:
    """2 dispatchers and 3 workers; two overlapping backfills sent while they run."""
    names = ["d1", "d2", "w1", "w2", "w3"]
    for name in names:
        (fleet.dispatcher if name.startswith("d") else fleet.worker)(name)
    wait_for(lambda: started(r, names), 30, "processes to start", fleet)
    job, now = every_second(client)
    a = client.backfill(job.id, now - 60 * S, now - 20 * S, overlap="allow")
    b = client.backfill(job.id, now - 40 * S, now, overlap="allow")
    assert len(a.queued) == 40 and len(b.queued) == 20 and len(b.existing) == 20
    want = {f"{job.id}@{t}" for t in range(now - 60 * S, now, S)}

    def all_ran() -> bool:
        log = [x.decode().split() for x in cast(list[bytes], r.lrange(LOG, 0, -1))]
        return {x[0] for x in log if x[3] == "finish"} >= want and quiet(r)

    wait_for(all_ran, 60, "every backfilled occurrence to run", fleet)
    time.sleep(1)
    log = [x.decode().split() for x in cast(list[bytes], r.lrange(LOG, 0, -1))]
    starts = Counter(x[0] for x in log if x[3] == "start")
    assert set(starts) == want and set(starts.values()) == {1}


def test_a_backfill_is_acknowledged_only_once_replicas_have_it(redis_url: str) -> None:
    """Durable like every client-facing write: on a Redis without the replica asked for, WAIT
    falls short and the call says so (retrying it is safe: it runs nothing twice)."""
    with Client(redis_url) as plain:
        job, now = every_second(plain)
    with Client(settings=settings(redis_url, wait_replicas=1, wait_timeout_ms=50)) as c:
        with pytest.raises(NotReplicated):
            c.backfill(job.id, now - 2 * S, now)
        assert c.backfill(job.id, now - 2 * S, now, dry_run=True).times  # a read: no WAIT


def test_start_lag_counts_from_when_a_run_was_meant_to_start_not_its_nominal_time(
    redis_url: str, client: Client
) -> None:
    """A backfilled occurrence an hour old, and a one-off job created with a time an hour past,
    start at once: their start lag is that of their dispatch, not an hour (an alert on p99 lag
    would fire on every backfill)."""
    job, now = every_second(client)
    hour = 3600 * S
    assert len(client.backfill(job.id, now - hour, now - hour + 10 * S,
                               overlap="allow").queued) == 10
    client.schedule("record", run_at=now - hour)
    log: list[tuple[str, int]] = []
    lags: list[float] = []

    async def scenario() -> None:
        async with Rig(redis_url, recording_app(log)) as rig:
            await run_all(rig)
            lags.extend(rig.worker.metrics.lag.total())

    asyncio.run(scenario())
    assert len(log) == 11
    counts, total_s = lags[:-1], lags[-1]
    assert sum(counts) == 11 and total_s < 11 * 60, lags  # each well under the hour
