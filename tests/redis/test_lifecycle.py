"""Lifecycle limits (startAt, endAt, maxRuns, pauseAfterFailures, startDeadlineSeconds) and
pause/resume notes: the pure planning in rsched.core.lifecycle, then a real Dispatcher and Worker
on a real redis-server stepped by hand (tests/helpers.Rig, an injected clock), then the faces.
The multi-process checks are in tests/processes/test_lifecycle_fleet.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.cli import as_json, ok, run_main
from support.helpers import ManualClock, Rig, overdue, redis_now_ms
from support.helpers import settings as _settings

from rsched import App, Client, JobContext, JobSpec, JobStatus, RunState
from rsched.api.app import create_app
from rsched.core.cron import parse_cron
from rsched.core.errors import ValidationError
from rsched.core.lifecycle import (
    NEVER_MS,
    NO_LIFE,
    Life,
    bounded,
    life_of,
    life_packed,
    skip_reason,
)
from rsched.core.models import SPEC_WITH_LIFE, Run, pack_spec
from rsched.rdb import keys, scripts
from rsched.service.patch import JobPatch
from rsched.service.shapes import LIFE_KEYS, job_json

MINUTE = 60_000
T0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE  # a whole minute


# --- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("life", "after", "expected"), [
    (NO_LIFE, T0, T0 + MINUTE),
    (Life(start_at_ms=T0 + 10 * MINUTE), T0, T0 + 10 * MINUTE),  # startAt itself may fire
    (Life(start_at_ms=T0 + 10 * MINUTE + 1), T0, T0 + 11 * MINUTE),
    (Life(end_at_ms=T0 + MINUTE), T0, T0 + MINUTE),  # endAt itself may fire
    (Life(end_at_ms=T0 + MINUTE - 1), T0, NEVER_MS),
    (Life(start_at_ms=T0, end_at_ms=T0 + 5 * MINUTE), T0 + 5 * MINUTE, NEVER_MS),
    (Life(end_at_ms=T0 + MINUTE), NEVER_MS, NEVER_MS),
])
def test_a_bounded_schedule_fires_only_inside_start_at_and_end_at(
    life: Life, after: int, expected: int
) -> None:
    assert bounded(parse_cron("* * * * *", "UTC").next_after, life)(after) == expected


@pytest.mark.parametrize(("at", "kept", "life", "runs", "reason"), [
    (T0, 0, NO_LIFE, 0, None),
    (T0, 0, Life(start_at_ms=T0 + 1), 0, "beforeStartAt"),
    (T0 + 2, 0, Life(end_at_ms=T0 + 1), 0, "afterEndAt"),
    (T0, 2, Life(max_runs=5), 3, "beyondMaxRuns"),
    (T0, 1, Life(max_runs=5), 3, None),
])
def test_the_preview_marks_what_the_policies_would_skip(
    at: int, kept: int, life: Life, runs: int, reason: str | None
) -> None:
    assert skip_reason(at, kept, life, runs) == reason


def test_limits_pack_as_text_at_the_spec_end_and_none_left_out() -> None:
    life = Life(1, 2, 3, 4, 5)
    assert life_of(life_packed(life)) == life and life_packed(NO_LIFE) is None
    def spec(life_text: str | None) -> bytes:  # a payload that looks like limits, too
        return pack_spec(1, 1, 1, 0, "UTC", "", 0, "", 0, b"\xaaL1,2,3,4,5", 0, "skip", life_text)
    assert spec(None)[0] == 0x9c  # 12 elements: lua/include/life.lua's byte test says none
    assert spec(life_packed(life))[0] == SPEC_WITH_LIFE
    assert spec(life_packed(life)).endswith(b"L1,2,3,4,5")


@pytest.mark.parametrize(("kw", "field"), [
    ({"cron": "* * * * *", "max_runs": 0}, "maxRuns"),
    ({"cron": "* * * * *", "pause_after_failures": True}, "pauseAfterFailures"),
    ({"max_runs": 3}, "maxRuns"),  # one-off
    ({"start_at": T0}, "startAt"),
    ({"cron": "* * * * *", "start_at": 10**18}, "startAt"),
    ({"cron": "* * * * *", "start_deadline_ms": 1000}, "startDeadlineSeconds"),
    ({"start_deadline_ms": 0}, "startDeadlineSeconds"),
    ({"cron": "* * * * *", "start_at": T0, "end_at": T0}, "endAt"),
    ({"cron": "0 0 1 1 *", "end_at": 1000}, "endAt"),  # no occurrence left
])
def test_limits_are_refused_naming_the_field(client: Client, kw: dict[str, Any],
                                             field: str) -> None:
    with pytest.raises(ValidationError) as e:
        client.schedule("t", **kw)
    assert e.value.field == field


# --- claim and complete, stepped --------------------------------------------------------------


def counting_app(fail: set[str] | None = None) -> tuple[App, list[str]]:
    """An app whose "job" handler logs its run ids, and fails those in ``fail``."""
    app, ran = App("life"), []

    @app.job("job")
    def job(ctx: JobContext) -> None:
        ran.append(ctx.run_id)
        if fail is not None and ctx.run_id in fail:
            raise RuntimeError("boom")

    return app, ran


def run_of(client: Client, run_id: str) -> Run:
    run = client.run(client.op_read_runs([run_id]))[0]
    assert run is not None, run_id
    return run


def minutes(rig: Rig, clock: ManualClock, start_ms: int, n: int) -> Any:
    """Step the rig through n minutes from start_ms: a claim, fetch and finish each."""
    async def go() -> None:
        for k in range(n):
            clock.ms = start_ms + k * MINUTE
            await rig.cycle()
    return go()


def test_max_runs_completes_the_job_after_exactly_n_runs_with_remaining_runs_counting_down(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    job = client.schedule("job", cron="* * * * *", max_runs=3)
    assert job.next_ms is not None and job_json(job)["remainingRuns"] == 3
    app, ran = counting_app()
    seen = []

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            for k in range(5):
                clock.ms = job.next_ms + k * MINUTE  # type: ignore[operator]
                await rig.cycle()
                seen.append(job_json(client.get(job.id))["remainingRuns"])

    asyncio.run(scenario())
    assert len(ran) == 3 and seen == [2, 1, 0, 0, 0]
    done = client.get(job.id)
    assert done.status is JobStatus.COMPLETED and job_json(done)["nextRunAt"] is None
    assert r.zscore(keys.due(done.partition), job.id) is None


def test_end_at_runs_every_occurrence_up_to_it_then_completes_and_start_at_holds_the_first(
    redis_url: str, client: Client, clock: ManualClock
) -> None:
    first = parse_cron("* * * * *", "UTC").next_after(clock())
    job = client.schedule("job", cron="* * * * *", start_at=first + 2 * MINUTE,
                          end_at=first + 4 * MINUTE)
    assert job.next_ms == first + 2 * MINUTE  # nothing before startAt
    app, ran = counting_app()

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await minutes(rig, clock, first + 2 * MINUTE, 5)

    asyncio.run(scenario())
    assert ran == [f"{job.id}@{first + k * MINUTE}" for k in (2, 3, 4)]
    assert client.get(job.id).status is JobStatus.COMPLETED


def test_skipped_occurrences_do_not_count_toward_max_runs(
    redis_url: str, client: Client, clock: ManualClock
) -> None:
    """Overlap skip: the occurrence claimed while the first run is still queued is recorded as
    skipped and leaves the count as it was."""
    job = client.schedule("job", cron="* * * * *", max_runs=2, overlap="skip")
    t0 = job.next_ms
    assert t0 is not None
    app, ran = counting_app()

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            clock.ms = t0
            assert (await rig.claim()).dispatched == 1
            clock.ms += MINUTE
            assert (await rig.claim()).skipped == 1  # the first is still queued
            assert client.get(job.id).remaining_runs == 1
            assert await rig.fetch() == 1 and await rig.finish() == 1
            await minutes(rig, clock, t0 + 2 * MINUTE, 3)

    asyncio.run(scenario())
    assert ran == [f"{job.id}@{t0}", f"{job.id}@{t0 + 2 * MINUTE}"]
    assert client.get(job.id).status is JobStatus.COMPLETED


def test_pause_after_failures_pauses_at_exactly_n_dead_letters_in_a_row_and_a_success_resets(
    redis_url: str, client: Client, clock: ManualClock
) -> None:
    job = client.schedule("job", cron="* * * * *", pause_after_failures=2, max_attempts=1)
    t0 = job.next_ms
    assert t0 is not None
    occ = [f"{job.id}@{t0 + k * MINUTE}" for k in range(4)]
    app, ran = counting_app(fail={occ[0], occ[2], occ[3]})  # dead, ok, dead, dead
    streaks = []

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            for k in range(6):
                clock.ms = t0 + k * MINUTE
                await rig.cycle()
                streaks.append((client.get(job.id).fail_streak, client.get(job.id).status))

    asyncio.run(scenario())
    assert ran == occ  # nothing after the pause
    s, p = JobStatus.SCHEDULED, JobStatus.PAUSED
    assert streaks == [(1, s), (0, s), (1, s), (2, p), (2, p), (2, p)]
    out = job_json(client.get(job.id))
    assert out["pausedBy"] == "pauseAfterFailures" and out["deadLetterStreak"] == 2
    assert out["pausedReason"] == f"2 consecutive occurrences dead-lettered (the last: {occ[3]})"
    resumed = client.resume(job.id, note="fixed the handler", by="ops")
    assert resumed.status is JobStatus.SCHEDULED and resumed.fail_streak == 0
    assert resumed.resumed is not None and resumed.resumed.note == "fixed the handler"


def test_a_one_off_job_claimed_past_its_start_deadline_is_dead_lettered_never_run(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    # Past its deadline at creation: not sent straight to its queue (lua/schedule.lua) but left
    # to the claim, like one held in the due set by a dispatcher outage (`overdue`).
    late = client.schedule("job", run_at=clock() - 10_000, start_deadline_ms=5_000)
    [in_time] = overdue(client, [JobSpec("job", run_at=clock() - 1_000, start_deadline_ms=5_000)])
    app, ran = counting_app()

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            claimed = await rig.claim()
            assert (claimed.dispatched, claimed.skipped) == (1, 1)
            assert await rig.fetch() == 1 and await rig.finish() == 1

    asyncio.run(scenario())
    late_run = f"{late.id}@{late.next_ms}"
    assert ran == [f"{in_time.id}@{in_time.next_ms}"]
    dead = run_of(client, late_run)
    # Its first attempt, ended before it began: attempt 1 in the run, its history and the
    # events (the archive's view), like any other ended attempt.
    assert (dead.state, dead.error, dead.attempt) == (RunState.DEAD, "missed start deadline", 1)
    [kept] = client.runs(late.id)
    assert (kept.run_id, kept.attempt, kept.status, kept.error, kept.dead_lettered) == (
        late_run, 1, "dead", "missed start deadline", True)
    [seen] = client.history(late.id).items
    assert (seen.run_id, seen.attempt, seen.status, seen.error) == (
        late_run, 1, "dead", "missed start deadline")
    assert client.get(late.id).status is JobStatus.DEAD
    assert r.zscore(keys.dead(late.partition), late_run) is not None


def test_a_run_dispatched_in_time_but_held_past_its_deadline_is_dead_lettered_at_start(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    """The worker asks lua/expire.lua (Redis's clock) before the handler runs; a replay,
    dispatched after the deadline on purpose, runs."""
    now = redis_now_ms(r)
    job = client.schedule("job", run_at=now - 500, start_deadline_ms=1_500)
    run_id = f"{job.id}@{job.next_ms}"
    assert run_of(client, run_id).state is RunState.DISPATCHED  # in time, straight to its queue
    app, ran = counting_app()

    async def scenario() -> None:
        async with Rig(redis_url, app) as rig:
            await asyncio.sleep(1.5)  # held in the stream past runAt + 1.5 s
            assert await rig.fetch() == 1
            await rig.finish()
            assert ran == []
            dead = run_of(client, run_id)
            assert (dead.state, dead.error) == (RunState.DEAD, "missed start deadline")
            client.replay(run_id)
            await rig.cycle()

    asyncio.run(scenario())
    assert ran == [run_id] and run_of(client, run_id).state is RunState.SUCCEEDED
    assert "expire" in scripts.NAMES


def test_patch_changes_the_limits_and_refuses_max_runs_at_or_below_the_runs_started(
    redis_url: str, client: Client, clock: ManualClock
) -> None:
    job = client.schedule("job", cron="* * * * *", max_runs=5)
    assert job.next_ms is not None
    app, _ = counting_app()

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock) as rig:
            await minutes(rig, clock, job.next_ms, 2)  # type: ignore[arg-type]

    asyncio.run(scenario())
    with pytest.raises(ValidationError) as e:
        client.update(job.id, JobPatch(max_runs=2))
    assert e.value.field == "maxRuns"
    assert client.update(job.id, JobPatch(max_runs=3)).remaining_runs == 1
    cleared = client.update(job.id, JobPatch(max_runs=None, end_at=clock() + 10 * MINUTE))
    assert cleared.remaining_runs is None and cleared.life.end_at_ms == clock() + 10 * MINUTE


# --- faces ---------------------------------------------------------------------------------------


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as c:
        yield c


def test_a_job_without_limits_shows_the_same_lifecycle_fields_as_one_with_them(
    client: Client
) -> None:
    plain = job_json(client.schedule("t"))
    limited = job_json(client.schedule("t", cron="* * * * *", max_runs=2))
    assert set(plain) == set(limited) and set(LIFE_KEYS) <= set(plain)
    assert (plain["maxRuns"], plain["remainingRuns"], plain["deadLetterStreak"]) == (None, None, 0)


def test_the_api_takes_the_limits_in_camel_case_and_names_a_bad_one(api: TestClient) -> None:
    body = {"type": "t", "cron": "*/5 * * * *", "startAt": "2030-01-01T00:00:00Z",
            "endAt": "2030-02-01T00:00:00Z", "maxRuns": 10, "pauseAfterFailures": 3}
    res = api.post("/jobs", json=body)
    assert res.status_code == 201, res.text
    j = res.json()
    assert (j["startAt"], j["endAt"], j["maxRuns"], j["remainingRuns"], j["pauseAfterFailures"]
            ) == ("2030-01-01T00:00:00.000Z", "2030-02-01T00:00:00.000Z", 10, 10, 3)
    assert j["nextRunAt"] == "2030-01-01T00:00:00.000Z"
    res = api.patch(f"/jobs/{j['id']}", json={"maxRuns": 4, "endAt": None})
    assert res.status_code == 200, res.text
    assert (res.json()["maxRuns"], res.json()["endAt"]) == (4, None)
    once = api.post("/jobs", json={"type": "t", "startDeadlineSeconds": 30}).json()
    assert once["startDeadlineSeconds"] == 30
    for bad, field in (({"maxRuns": "3"}, "maxRuns"), ({"endAt": "soon"}, "endAt"),
                       ({"startDeadlineSeconds": 5}, "startDeadlineSeconds")):
        res = api.post("/jobs", json={"type": "t", "cron": "* * * * *", **bad})
        assert res.status_code == 422 and res.json()["errors"][0]["field"] == field, res.text


def test_pause_and_resume_keep_the_note_who_and_when_and_refuse_a_bad_note(
    api: TestClient
) -> None:
    j = api.post("/jobs", json={"type": "t", "cron": "* * * * *"}).json()
    paused = api.post(f"/jobs/{j['id']}/pause", json={"note": "db migration"}).json()
    assert (paused["status"], paused["pauseNote"], paused["pausedBy"]) == (
        "paused", "db migration", "api (auth off)")
    assert paused["pausedAt"] and paused["pausedReason"] is None
    resumed = api.post(f"/jobs/{j['id']}/resume").json()  # no body: no note
    assert (resumed["status"], resumed["resumeNote"], resumed["resumedBy"]) == (
        "scheduled", None, "api (auth off)")
    assert resumed["pauseNote"] == "db migration"  # the latest pause stays on record
    for bad, field in (({"note": 3}, "note"), ({"why": "x"}, "why"), ([1], "body")):
        res = api.post(f"/jobs/{j['id']}/pause", json=bad)
        assert res.status_code == 422 and res.json()["errors"][0]["field"] == field, res.text


def test_the_preview_of_a_job_marks_the_occurrences_its_limits_skip(
    api: TestClient, redis_url: str
) -> None:
    j = api.post("/jobs", json={"type": "t", "cron": "0 * * * *", "maxRuns": 2,
                                "startAt": "2030-01-01T02:00:00Z",
                                "endAt": "2030-01-01T05:00:00Z"}).json()
    res = api.get("/schedules/preview", params={"jobId": j["id"], "count": 6,
                                               "from": "2030-01-01T00:30:00Z"})
    assert res.status_code == 200, res.text
    marks = [(t["utc"][11:13], t.get("skipped")) for t in res.json()["times"]]
    assert marks == [("01", "beforeStartAt"), ("02", None), ("03", None),
                     ("04", "beyondMaxRuns"), ("05", "beyondMaxRuns"), ("06", "afterEndAt")]
    assert api.get("/schedules/preview", params={"jobId": "0-nope"}).status_code == 404
    out = as_json(redis_url, "preview", "--job", j["id"], "--from", "2030-01-01T00:30:00Z",
                  "--count", "2")
    assert [t.get("skipped") for t in out] == ["beforeStartAt", None]


def test_the_cli_adds_limits_and_pauses_with_a_note_as_cli(redis_url: str) -> None:
    job = as_json(redis_url, "jobs", "add", "--type", "t", "--cron", "* * * * *",
                  "--max-runs", "7", "--pause-after-failures", "2", "--end-at",
                  "2031-01-01T00:00:00Z")
    assert (job["maxRuns"], job["pauseAfterFailures"], job["endAt"]) == (
        7, 2, "2031-01-01T00:00:00.000Z")
    ok(redis_url, "jobs", "pause", job["id"], "--note", "holiday freeze")
    shown = as_json(redis_url, "jobs", "show", job["id"])
    assert (shown["pausedBy"], shown["pauseNote"]) == ("cli", "holiday freeze")
    bad = run_main(redis_url, "jobs", "add", "--type", "t", "--start-deadline", "5", "--cron",
                   "* * * * *")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: --start-deadline: applies to one-off jobs only")
