"""The HTTP API through Starlette's test client, against the real session redis-server."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from openapi_spec_validator import validate
from starlette.testclient import TestClient
from support.helpers import Rig, open_client, problem_of
from support.helpers import settings as _settings

from rsched import App, Client, JobContext
from rsched.api.app import API_ROUTES, create_app, openapi_paths
from rsched.api.openapi import document
from rsched.core.layout import J
from rsched.core.models import partition_of
from rsched.rdb import keys
from rsched.rdb.ops import Scripts
from rsched.service.apikeys import op_create_key, op_revoke_key

LATER = "2030-01-01T00:00:00Z"


NO_RUN = {"runId": None, "status": None, "at": None, "failureStreak": 0, "streakCapped": False}


def _stored(api: TestClient, job_id: str) -> dict[str, Any]:
    """GET /jobs/{id} of a job that has not run: the job as created or changed, and its
    lastRun (none yet)."""
    got = api.get(f"/jobs/{job_id}").json()
    assert got.pop("lastRun") == NO_RUN
    return got  # type: ignore[no-any-return]


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


@pytest.fixture
def sync_client(redis_url: str) -> Iterator[Client]:
    yield from open_client(redis_url)




# --- scheduling ----------------------------------------------------------------------------------


def test_post_jobs_creates_a_job_and_answers_201_with_camel_case_fields_and_utc_times(
    api: TestClient, r: redis.Redis
) -> None:
    res = api.post("/jobs", json={
        "type": "email.send", "payload": {"to": "a@example.com"},
        "runAt": "2030-01-01T01:00:00+01:00",
        "maxAttempts": 5, "queue": "mail", "priority": 3, "timeoutSeconds": 2.5,
        "backoff": {"baseSeconds": 2, "capSeconds": 60}, "jitterSeconds": 0,
    })
    assert res.status_code == 201, res.text
    job = res.json()
    assert res.headers["location"] == f"/jobs/{job['id']}"
    assert job["status"] == "scheduled"
    assert job["runAt"] == job["nextRunAt"] == "2030-01-01T00:00:00.000Z"
    assert (job["maxAttempts"], job["queue"], job["priority"]) == (5, "mail", 3)
    assert job["timeoutSeconds"] == 2.5
    assert job["backoff"] == {"baseSeconds": 2, "capSeconds": 60}
    assert job["createdAt"].endswith("Z")
    assert job.pop("deduplicated") is False  # a create's answer only
    assert _stored(api, job["id"]) == job
    p = partition_of(job["id"])
    # Priority 3 orders it ahead of priority-0 jobs due in the same millisecond.
    assert r.zscore(keys.due(p), job["id"]) == 1893456000000 - 3 / 2048


def test_the_same_idempotency_key_returns_200_with_the_same_job_and_another_body_is_409(
    api: TestClient,
) -> None:
    body = {"type": "report", "cron": "0 6 * * *", "timeZone": "Europe/Berlin",
            "idempotencyKey": "daily-report"}
    first = api.post("/jobs", json=body)
    again = api.post("/jobs", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    conflict = api.post("/jobs", json=dict(body, cron="0 7 * * *"))
    problem_of(conflict, 409, "idempotencyKey")


def test_the_catch_up_window_defaults_to_60_s_and_round_trips_in_seconds(api: TestClient) -> None:
    default = api.post("/jobs", json={"type": "t", "cron": "@hourly"}).json()
    assert (default["catchUpWindowSeconds"], default["misfire"], default["lastGap"]) == (
        60, "run_once", None)
    assert default["overlap"] == "allow"
    buffered = api.post("/jobs", json={"type": "t", "cron": "@hourly", "overlap": "bufferOne"})
    assert buffered.json()["overlap"] == "bufferOne"
    to_one_off = api.patch(f"/jobs/{buffered.json()['id']}", json={"runAt": LATER}).json()
    assert to_one_off["overlap"] == "allow"  # a one-off job has no overlap to decide
    job = api.post("/jobs", json={"type": "t", "cron": "*/5 * * * *", "misfire": "runOnce",
                                  "catchUpWindowSeconds": 2.5}).json()
    assert (job["catchUpWindowSeconds"], job["misfire"]) == (2.5, "run_once")
    patched = api.patch(f"/jobs/{job['id']}", json={"priority": 3}).json()
    assert patched["catchUpWindowSeconds"] == 2.5  # a change keeps the window


def test_a_cron_macro_is_kept_as_given_and_runs_on_its_five_field_times(api: TestClient) -> None:
    job = api.post("/jobs", json={"type": "report", "cron": "@daily",
                                  "timeZone": "Asia/Kolkata"}).json()
    assert job["cron"] == "@daily"
    assert job["nextRunAt"].endswith("T18:30:00.000Z")  # local midnight, UTC+05:30


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "t", "cron": "61 * * * *"}, "cron"),
        ({"type": "t", "cron": "0 0 30 2 *"}, "cron"),
        ({"type": "t", "cron": "@reboot"}, "cron"),
        ({"type": "t", "cron": "0 3 * * *", "timeZone": "Mars/Olympus"}, "timeZone"),
        ({"type": "t", "runAt": "tomorrow"}, "runAt"),
        ({"type": "t", "runAt": "2030-01-01T00:00:00"}, "runAt"),
        ({"type": "t", "runAt": 1893456000000}, "runAt"),
        ({"type": "t", "runAt": LATER, "cron": "* * * * *"}, "runAt"),
        ({"type": "t", "maxAttempts": -1}, "maxAttempts"),
        ({"type": "t", "maxAttempts": "3"}, "maxAttempts"),
        ({"type": "t", "priority": 1.5}, "priority"),
        ({"type": "t", "timeoutSeconds": 0}, "timeoutSeconds"),
        ({"type": "t", "jitterSeconds": -1}, "jitterSeconds"),
        ({"type": "t", "backoff": {"baseSeconds": "1"}}, "backoff.baseSeconds"),
        ({"type": "t", "backoff": {"base": 1}}, "backoff.base"),
        ({"type": "t", "backoff": 5}, "backoff"),
        ({"type": "t", "misfire": "catch_up"}, "misfire"),
        ({"type": "t", "cron": "@daily", "catchUpWindowSeconds": -1}, "catchUpWindowSeconds"),
        ({"type": "t", "cron": "@daily", "overlap": "never"}, "overlap"),
        ({"type": "t", "overlap": "skip"}, "overlap"),
        ({"type": "t", "cron": "@daily", "catchUpWindowSeconds": "60"}, "catchUpWindowSeconds"),
        ({"type": "t", "cron": "@daily", "catchUpWindowSeconds": 2_592_001},
         "catchUpWindowSeconds"),
        ({"type": "t", "queue": "no spaces"}, "queue"),
        ({"type": "t", "idempotencyKey": ""}, "idempotencyKey"),
        ({"type": "t", "paused": "yes"}, "paused"),
        # what the exact-type shortcut in spec_from_json must still send to the converters
        ({"type": "t", "maxAttempts": True}, "maxAttempts"),
        ({"type": "t", "priority": False}, "priority"),
        ({"type": "t", "maxAttempts": 3.0}, "maxAttempts"),
        ({"type": "t", "paused": 1}, "paused"),
        ({"type": "t", "queue": 7}, "queue"),
        ({"type": "t", "runAt": True}, "runAt"),
        ({"type": 1}, "type"),
        ({"type": None, "payload": 1}, "type"),
        ({"payload": None, "colour": "red", "type": "t"}, "colour"),
        ({"type": "t", "colour": "red"}, "colour"),
        ({"type": "bad type!"}, "type"),
        ({"type": "trailing.newline\n"}, "type"),
        ({"payload": 1}, "type"),
        ([{"type": "t"}], "body"),
    ],
)
def test_invalid_values_are_422_problems_naming_the_field(
    api: TestClient, r: redis.Redis, body: Any, field: str
) -> None:
    problem_of(api.post("/jobs", json=body), 422, field)
    assert not list(r.scan_iter(match=keys.job_pattern()))


@pytest.mark.parametrize(
    "raw", [b"{", b"", b"   ", b'{"type": NaN}', b'{"type": "t", "priority": Infinity}',
            b"\xff\xfe\xfa", b"[" * 100_000]
)
def test_malformed_json_is_a_400_problem_naming_the_body(api: TestClient, raw: bytes) -> None:
    res = api.post("/jobs", content=raw, headers={"content-type": "application/json"})
    problem_of(res, 400, "body")


def test_a_payload_over_the_limit_is_413_naming_the_payload(redis_url: str) -> None:
    app = create_app(_settings(redis_url, max_payload_bytes=1000), auth=False)
    with TestClient(app) as api:
        problem_of(api.post("/jobs", json={"type": "t", "payload": "x" * 2000}), 413, "payload")
        assert api.post("/jobs", json={"type": "t", "payload": "x" * 900}).status_code == 201


def test_a_body_over_the_limit_is_413_naming_the_body(redis_url: str) -> None:
    with TestClient(create_app(_settings(redis_url), auth=False, max_body_bytes=500)) as api:
        problem_of(api.post("/jobs", json={"type": "t", "payload": "y" * 600}), 413, "body")


def test_a_batch_answers_one_result_per_job_in_order_with_errors_in_place(
    api: TestClient,
) -> None:
    jobs: list[Any] = [{"type": "a", "runAt": LATER}, {"type": "b", "cron": "nope"}, 7,
                       {"type": "c", "idempotencyKey": "k"}, {"type": "c", "idempotencyKey": "k"},
                       {"type": "d", "idempotencyKey": "k"}]
    res = api.post("/jobs/batch", json={"jobs": jobs})
    assert res.status_code == 200, res.text
    results = res.json()["results"]
    assert [x["status"] for x in results] == [201, 422, 422, 201, 200, 409]
    assert results[0]["job"]["type"] == "a"
    assert results[1]["error"]["errors"][0]["field"] == "jobs[1].cron"
    assert results[2]["error"]["errors"][0]["field"] == "jobs[2]"
    assert results[3]["job"]["id"] == results[4]["job"]["id"]
    assert results[5]["error"]["errors"][0]["field"] == "jobs[5].idempotencyKey"


def test_a_batch_answers_each_job_as_get_does_with_its_own_seconds_and_times(
    api: TestClient,
) -> None:
    jobs = [{"type": "a", "runAt": LATER, "timeoutSeconds": 1.5, "jitterSeconds": 2.0,
             "backoff": {"baseSeconds": 0.25, "capSeconds": 60}},
            {"type": "a", "runAt": "2031-06-01T12:30:00.125+02:00", "timeoutSeconds": 2,
             "maxAttempts": 7, "paused": True},
            {"type": "a", "cron": "0 3 * * *", "timeZone": "Europe/Paris", "priority": -5}]
    results = api.post("/jobs/batch", json={"jobs": jobs}).json()["results"]
    first, second, third = (x["job"] for x in results)
    assert (first["timeoutSeconds"], first["jitterSeconds"], first["backoff"]) == (
        1.5, 2, {"baseSeconds": 0.25, "capSeconds": 60})
    assert (second["runAt"], second["timeoutSeconds"], second["status"]) == (
        "2031-06-01T10:30:00.125Z", 2, "paused")
    assert second["nextRunAt"] is None and third["nextRunAt"] is not None
    for job in (first, second, third):
        assert job.pop("deduplicated") is False
        assert _stored(api, job["id"]) == job


def test_a_batch_takes_1000_jobs_and_refuses_1001(api: TestClient, r: redis.Redis) -> None:
    ok = api.post("/jobs/batch", json={"jobs": [{"type": "bulk", "runAt": LATER}] * 1000})
    assert [x["status"] for x in ok.json()["results"]] == [201] * 1000
    assert len(list(r.scan_iter(match=keys.job_pattern(), count=1000))) == 1000
    problem_of(api.post("/jobs/batch", json={"jobs": [{"type": "bulk"}] * 1001}), 422, "jobs")
    problem_of(api.post("/jobs/batch", json={"jobs": [], "extra": 1}), 422, "extra")
    problem_of(api.post("/jobs/batch", json={}), 422, "jobs")


# --- reading -------------------------------------------------------------------------------------


def test_listing_jobs_filters_by_status_type_and_queue_and_pages_through_everything_once(
    api: TestClient,
) -> None:
    made: dict[str, dict[str, Any]] = {}
    for i in range(45):
        body = {"type": "even" if i % 2 == 0 else "odd", "runAt": LATER,
                "queue": "q1" if i % 3 == 0 else "default", "paused": i % 5 == 0}
        job = api.post("/jobs", json=body).json()
        made[job["id"]] = job
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        params: dict[str, Any] = {"limit": 7}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/jobs", params=params).json()
        assert len(page["jobs"]) <= 7
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made)
    paused = api.get("/jobs", params={"status": "paused", "limit": 1000}).json()["jobs"]
    assert {j["id"] for j in paused} == {i for i, j in made.items() if j["status"] == "paused"}
    both = api.get("/jobs", params={"type": "odd", "queue": "q1", "limit": 1000}).json()["jobs"]
    assert {j["id"] for j in both} == {
        i for i, j in made.items() if j["type"] == "odd" and j["queue"] == "q1"
    }
    problem_of(api.get("/jobs", params={"status": "sleeping"}), 422, "status")
    problem_of(api.get("/jobs", params={"cursor": "garbage!"}), 422, "cursor")
    problem_of(api.get("/jobs", params={"limit": "ten"}), 422, "limit")
    problem_of(api.get("/jobs", params={"limit": 0}), 422, "limit")


def test_unknown_and_malformed_job_ids_are_404_problems(api: TestClient) -> None:
    for path in ("/jobs/3-NOSUCHJOB", "/jobs/not-an-id", "/jobs/x/runs", "/jobs/5-x/pause"):
        method = api.post if path.endswith("pause") else api.get
        problem_of(method(path), 404)
    problem_of(api.post("/dead-letters/nope/replay"), 404)
    problem_of(api.get("/no/such/route"), 404)
    problem_of(api.delete("/jobs"), 405)


def _handlers() -> App:
    app = App("api-test")

    @app.job("ok")
    def ok(ctx: JobContext) -> dict[str, Any]:
        return {"doubled": ctx.payload["n"] * 2}

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")

    return app


def _run_due(redis_url: str, rounds: int = 1) -> None:
    async def go() -> None:
        async with Rig(redis_url, _handlers()) as rig:
            for _ in range(rounds):
                await rig.cycle()

    asyncio.run(go())


def test_runs_list_every_attempt_newest_first_with_cursor_pages(
    api: TestClient, redis_url: str
) -> None:
    job = api.post("/jobs", json={"type": "ok", "payload": {"n": 21}}).json()
    _run_due(redis_url)
    for _ in range(3):
        assert api.post(f"/jobs/{job['id']}/trigger").status_code == 202
        _run_due(redis_url)
    runs = api.get(f"/jobs/{job['id']}/runs").json()
    assert runs["nextCursor"] is None
    assert len(runs["runs"]) == 4
    first = runs["runs"][0]
    assert set(first) == {"runId", "attempt", "status", "worker", "scheduledAt", "startedAt",
                          "endedAt", "durationMs", "error", "result", "deadLettered"}
    assert first["status"] == "succeeded" and first["result"] == {"doubled": 42}
    assert first["worker"] == "w-test" and first["endedAt"] >= first["startedAt"]
    ended = [x["endedAt"] for x in runs["runs"]]
    assert ended == sorted(ended, reverse=True)
    page1 = api.get(f"/jobs/{job['id']}/runs", params={"limit": 3}).json()
    page2 = api.get(f"/jobs/{job['id']}/runs",
                    params={"limit": 3, "cursor": page1["nextCursor"]}).json()
    assert page2["nextCursor"] is None
    assert page1["runs"] + page2["runs"] == runs["runs"]
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "completed"


def test_a_dead_letter_is_listed_and_replayed_and_a_repeated_replay_changes_nothing(
    api: TestClient, redis_url: str
) -> None:
    job = api.post("/jobs", json={"type": "boom", "maxAttempts": 1}).json()
    _run_due(redis_url)
    dead = api.get("/dead-letters").json()["deadLetters"]
    assert [d["jobId"] for d in dead] == [job["id"]]
    assert dead[0]["status"] == "dead" and "boom on attempt 1" in dead[0]["error"]
    assert dead[0]["deadAt"].endswith("Z")
    run_id = dead[0]["runId"]
    replayed = api.post(f"/dead-letters/{run_id}/replay")
    assert replayed.status_code == 200 and replayed.json()["status"] == "retry_wait"
    again = api.post(f"/dead-letters/{run_id}/replay")  # a client retry
    assert again.status_code == 200 and again.json() == replayed.json()
    assert api.get("/dead-letters").json()["deadLetters"] == []
    _run_due(redis_url)  # fails again: dead-lettered again
    assert [d["runId"] for d in api.get("/dead-letters").json()["deadLetters"]] == [run_id]
    ok = api.post("/jobs", json={"type": "ok", "payload": {"n": 1}}).json()
    _run_due(redis_url)
    ok_run = api.get(f"/jobs/{ok['id']}/runs").json()["runs"][0]["runId"]
    problem_of(api.post(f"/dead-letters/{ok_run}/replay"), 409, "runId")
    problem_of(api.get("/dead-letters", params={"cursor": "e30"}), 422, "cursor")


# --- changing jobs -------------------------------------------------------------------------------


def test_patch_reschedules_a_one_off_job_and_moves_its_due_entry(
    api: TestClient, r: redis.Redis
) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": LATER, "payload": {"v": 1}}).json()
    res = api.patch(f"/jobs/{job['id']}", json={"runAt": "2031-06-01T12:00:00Z",
                                                "payload": {"v": 2}, "priority": 9})
    assert res.status_code == 200, res.text
    new = res.json()
    assert new["nextRunAt"] == new["runAt"] == "2031-06-01T12:00:00.000Z"
    assert (new["payload"], new["priority"], new["createdAt"]) == ({"v": 2}, 9, job["createdAt"])
    assert r.zscore(keys.due(partition_of(job["id"])), job["id"]) == 1938081600000 - 9 / 2048
    assert _stored(api, job["id"]) == new
    # A priority change alone keeps the occurrence and moves it among same-millisecond jobs.
    res = api.patch(f"/jobs/{job['id']}", json={"priority": -4})
    assert res.status_code == 200 and res.json()["nextRunAt"] == new["nextRunAt"], res.text
    assert r.zscore(keys.due(partition_of(job["id"])), job["id"]) == 1938081600000 + 4 / 2048


def test_patch_to_a_cron_computes_the_next_run_from_now_in_the_zone(api: TestClient) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": LATER}).json()
    new = api.patch(f"/jobs/{job['id']}", json={"cron": "30 2 * * *",
                                                "timeZone": "America/New_York"}).json()
    assert (new["cron"], new["timeZone"], new["runAt"]) == ("30 2 * * *", "America/New_York", None)
    assert new["nextRunAt"] < job["nextRunAt"]
    assert new["nextRunAt"][11:16] in ("06:30", "07:30", "07:00")  # 02:30 EDT / EST / gap


def test_patch_of_a_paused_job_keeps_it_out_of_the_due_set_until_resumed(
    api: TestClient, r: redis.Redis
) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": LATER, "paused": True}).json()
    api.patch(f"/jobs/{job['id']}", json={"runAt": "2032-01-01T00:00:00Z"})
    due = keys.due(partition_of(job["id"]))
    assert r.zscore(due, job["id"]) is None
    resumed = api.post(f"/jobs/{job['id']}/resume").json()
    assert resumed["status"] == "scheduled" and resumed["nextRunAt"] == "2032-01-01T00:00:00.000Z"
    assert r.zscore(due, job["id"]) == 1956528000000


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [({}, 422, "body"), ({"queue": "other"}, 422, "queue"), ({"runAt": None}, 422, "runAt"),
     ({"runAt": LATER, "cron": "* * * * *"}, 422, "runAt"), ({"cron": "bad"}, 422, "cron"),
     ({"maxAttempts": 0}, 422, "maxAttempts"), ({"timeZone": "Nowhere/Land"}, 422, "timeZone")],
)
def test_invalid_patches_are_422_problems_naming_the_field(
    api: TestClient, body: dict[str, Any], status: int, field: str
) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": LATER}).json()
    job.pop("deduplicated")  # a create's answer only
    problem_of(api.patch(f"/jobs/{job['id']}", json=body), status, field)
    assert _stored(api, job["id"]) == job


def test_a_cancelled_job_cannot_be_patched_or_resumed(api: TestClient) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": LATER}).json()
    assert api.post(f"/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    assert api.post(f"/jobs/{job['id']}/cancel").status_code == 200  # idempotent
    problem_of(api.patch(f"/jobs/{job['id']}", json={"priority": 1}), 409, "status")
    problem_of(api.post(f"/jobs/{job['id']}/resume"), 409, "status")
    problem_of(api.post(f"/jobs/{job['id']}/trigger"), 409, "status")
    problem_of(api.patch("/jobs/1-NOPE", json={"priority": 1}), 404)


def test_the_update_script_is_a_compare_and_set_safe_to_apply_twice(
    sync_client: Client, r: redis.Redis
) -> None:
    job = sync_client.schedule("t", run_at=1893456000000)
    p = job.partition
    call = ("update", [keys.job(p, job.id), keys.due(p), keys.events(p)],
            [job.id, 0, 0, "scheduled", 1893456000000, 1900000000000, 1900000000000,
             "", 1, J.max_attempts, 7])  # "": any version
    assert sync_client.run(_script(call)) == [1, b"scheduled"]
    assert sync_client.run(_script(call)) == [0, b"scheduled"]  # a retried call: no-op
    stale = (call[0], call[1], [*call[2][:4], 1893456000000, 1800000000000, 1800000000000,
                                "", 1, J.max_attempts, 8])
    assert sync_client.run(_script(stale)) == [-3, b"scheduled"]  # read before the change
    assert r.zscore(keys.due(p), job.id) == 1900000000000
    assert sync_client.get(job.id).max_attempts == 7


def _script(call: Any) -> Any:
    res = yield Scripts([call])
    return res[0]


# --- operations ----------------------------------------------------------------------------------


def test_preview_applies_the_dst_rules_and_names_bad_fields(api: TestClient) -> None:
    res = api.get("/schedules/preview", params={"cron": "30 2 * * *",
                                                "timeZone": "America/New_York",
                                                "from": "2026-03-07T00:00:00Z", "count": 4})
    assert res.status_code == 200, res.text
    assert res.json()["times"] == [
        {"utc": "2026-03-07T07:30:00.000Z", "local": "2026-03-07T02:30:00-05:00"},
        {"utc": "2026-03-08T07:00:00.000Z", "local": "2026-03-08T03:00:00-04:00"},
        {"utc": "2026-03-09T06:30:00.000Z", "local": "2026-03-09T02:30:00-04:00"},
        {"utc": "2026-03-10T06:30:00.000Z", "local": "2026-03-10T02:30:00-04:00"},
    ]
    assert len(api.get("/schedules/preview", params={"cron": "* * * * *"}).json()["times"]) == 5
    bad: list[tuple[dict[str, str | int], str]] = [
        ({"cron": "99 * * * *"}, "cron"), ({}, "cron"),
        ({"cron": "* * * * *", "timeZone": "Atlantis/City"}, "timeZone"),
        ({"cron": "* * * * *", "count": 0}, "count"),
        ({"cron": "* * * * *", "count": "x"}, "count"),
        ({"cron": "* * * * *", "from": "soon"}, "from"),
        ({"cron": "* * * * *", "from": "9999-01-01T00:00:00Z"}, "from")]
    for params, field in bad:
        problem_of(api.get("/schedules/preview", params=params), 422, field)


def test_status_reports_leases_backlog_workers_queues_and_dead_letters(
    api: TestClient, redis_url: str
) -> None:
    api.post("/jobs", json={"type": "boom", "maxAttempts": 1})
    api.post("/jobs", json={"type": "t", "runAt": "2000-01-01T00:00:00Z", "queue": "slow"})

    async def go() -> None:
        async with Rig(redis_url, _handlers()) as rig:
            await rig.cycle()
            await rig.worker.heartbeat_once()

    asyncio.run(go())
    s = api.get("/status").json()
    assert len(s["partitions"]) == 16
    assert {p["owner"] for p in s["partitions"]} == {"d-test"}
    assert all(p["fence"] >= 1 and p["leaseExpiresAt"].endswith("Z") for p in s["partitions"])
    assert s["dueBacklog"] == 0 and s["deadLetters"] == 1
    assert [d["id"] for d in s["dispatchers"]] == ["d-test"]
    assert s["dispatchers"][0]["partitions"] == list(range(16))
    assert [(w["id"], w["queues"], w["alive"]) for w in s["workers"]] == [
        ("w-test", ["default"], True)]
    slow = [q for q in s["queues"] if q["queue"] == "slow"]
    assert slow == [{"queue": "slow", "length": 1, "pending": 0, "liveWorkers": 0,
                     "unserved": True}]  # no worker reads "slow"


def test_healthz_and_readyz_and_readyz_refuses_an_evicting_redis(
    api: TestClient, r: redis.Redis
) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        body = problem_of(api.get("/readyz"), 503)
        assert "maxmemory-policy" in body["detail"]
    finally:
        r.config_set("maxmemory-policy", "noeviction")


def test_a_payload_scheduled_from_python_with_bytes_is_served_as_base64(
    api: TestClient, sync_client: Client
) -> None:
    job = sync_client.schedule("t", payload={"blob": b"\x00\xff", "n": [1.5]}, run_at=0)
    assert api.get(f"/jobs/{job.id}").json()["payload"] == {"blob": "AP8=", "n": [1.5]}


# --- auth ----------------------------------------------------------------------------------------


@pytest.fixture
def secured(redis_url: str) -> Iterator[tuple[TestClient, dict[str, str], Client]]:
    c = Client(settings=_settings(redis_url))
    secrets = {scope: c.run(op_create_key(f"{scope} key", scope))[1]
               for scope in ("read", "write", "admin")}
    app = create_app(_settings(redis_url), key_cache_s=0)
    with TestClient(app) as api:
        yield api, secrets, c
    c.close()


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_requests_without_a_valid_key_are_401_with_a_bearer_challenge(
    secured: tuple[TestClient, dict[str, str], Client],
) -> None:
    api, _, _ = secured
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}):
        res = api.get("/jobs", headers=headers)
        problem_of(res, 401)
        assert res.headers["www-authenticate"].startswith("Bearer")
    assert api.get("/healthz").status_code == 200
    assert api.get("/readyz").status_code == 200
    assert api.get("/openapi.json").status_code == 200


def test_scopes_nest_read_write_admin_and_a_wrong_scope_is_403(
    secured: tuple[TestClient, dict[str, str], Client],
) -> None:
    api, secrets, _ = secured
    assert api.get("/jobs", headers=_bearer(secrets["read"])).status_code == 200
    problem_of(api.post("/jobs", json={"type": "t"}, headers=_bearer(secrets["read"])), 403)
    job = api.post("/jobs", json={"type": "t", "runAt": LATER}, headers=_bearer(secrets["write"]))
    assert job.status_code == 201
    got = api.get(f"/jobs/{job.json()['id']}", headers=_bearer(secrets["write"]))
    assert got.status_code == 200
    problem_of(api.post("/dead-letters/1-x@1/replay", headers=_bearer(secrets["write"])), 403)
    problem_of(api.get("/api-keys", headers=_bearer(secrets["write"])), 403)
    problem_of(api.post("/dead-letters/1-x@1/replay", headers=_bearer(secrets["admin"])), 404)
    listed = api.get("/api-keys", headers=_bearer(secrets["admin"])).json()["keys"]
    assert sorted(k["scope"] for k in listed) == ["admin", "read", "write"]


def test_keys_are_stored_hashed_and_a_revoked_key_stops_working(
    secured: tuple[TestClient, dict[str, str], Client], r: redis.Redis
) -> None:
    api, secrets, c = secured
    stored = r.hgetall(keys.api_keys())
    assert set(stored) == {hashlib.sha256(s.encode()).hexdigest().encode()
                           for s in secrets.values()}
    assert not any(s.encode() in v for s in secrets.values() for v in stored.values())
    made = api.post("/api-keys", json={"name": "ci", "scope": "read"},
                    headers=_bearer(secrets["admin"]))
    assert made.status_code == 201
    new_secret, new_id = made.json()["secret"], made.json()["key"]["id"]
    assert api.get("/status", headers=_bearer(new_secret)).status_code == 200
    assert api.delete(f"/api-keys/{new_id}", headers=_bearer(secrets["admin"])).status_code == 200
    problem_of(api.get("/status", headers=_bearer(new_secret)), 401)
    c.run(op_revoke_key("read key"))
    problem_of(api.get("/jobs", headers=_bearer(secrets["read"])), 401)
    problem_of(api.post("/api-keys", json={"name": "x", "scope": "root"},
                        headers=_bearer(secrets["admin"])), 422, "scope")


# --- the document --------------------------------------------------------------------------------


def test_the_openapi_document_is_valid_3_1_and_covers_every_route(api: TestClient) -> None:
    served = api.get("/openapi.json").json()
    validate(served)
    validate(document(auth=True))
    assert served["openapi"] == "3.1.0"
    routes = {(method, path) for method, path, _, _ in API_ROUTES}
    assert openapi_paths() == routes | {("GET", "/openapi.json"), ("GET", "/docs")}
    for path, ops in served["paths"].items():
        for op in ops.values():
            assert op["responses"], path
    assert "security" not in served  # the no-auth app documents no security
    assert document(auth=True)["security"] == [{"bearer": []}]


def test_the_docs_page_renders_the_spec_without_loading_anything_from_elsewhere(
    api: TestClient,
) -> None:
    res = api.get("/docs")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/html")
    assert "openapi.json" in res.text
    assert "http://" not in res.text and "https://" not in res.text
    assert json.loads(json.dumps(api.get("/openapi.json").json()))["info"]["title"] == "rsched"


# --- versions and If-Match -----------------------------------------------------------------------


def test_every_change_increments_the_version_and_if_match_guards_it(api: TestClient) -> None:
    job = api.post("/jobs", json={"type": "t", "cron": "@hourly"}).json()
    assert job["version"] == 1
    url = f"/jobs/{job['id']}"
    assert api.get(url).json()["version"] == 1  # reads change nothing
    assert api.patch(url, json={"priority": 2}, headers={"If-Match": "1"}).json()["version"] == 2
    stale = api.patch(url, json={"priority": 3}, headers={"If-Match": "1"})
    problem_of(stale, 412, "If-Match")
    assert api.get(url).json()["priority"] == 2  # the stale change wrote nothing
    problem_of(api.post(f"{url}/pause", headers={"If-Match": "9"}), 412, "If-Match")
    assert api.post(f"{url}/pause", headers={"If-Match": "2"}).json()["version"] == 3
    problem_of(api.post(f"{url}/resume", headers={"If-Match": "2"}), 412, "If-Match")
    assert api.post(f"{url}/resume", headers={"If-Match": "3"}).json()["version"] == 4
    problem_of(api.post(f"{url}/cancel", headers={"If-Match": '"3"'}), 412, "If-Match")
    cancelled = api.post(f"{url}/cancel", headers={"If-Match": '"4"'}).json()
    assert (cancelled["status"], cancelled["version"]) == ("cancelled", 5)
    assert api.post(f"{url}/cancel").json()["version"] == 5  # no If-Match: any version


@pytest.mark.parametrize("value", ["abc", "-1", "", "1.5"])
def test_a_malformed_if_match_is_422_naming_it(api: TestClient, value: str) -> None:
    job = api.post("/jobs", json={"type": "t", "cron": "@hourly"}).json()
    problem_of(api.post(f"/jobs/{job['id']}/pause", headers={"If-Match": value}), 422, "If-Match")


def test_two_concurrent_patches_with_the_same_if_match_one_wins_one_is_412(
    redis_url: str,
) -> None:
    """Real threads, one API app each (own connections): the loser sees 412, never both 200."""
    with TestClient(create_app(_settings(redis_url), auth=False)) as a, \
            TestClient(create_app(_settings(redis_url), auth=False)) as b:
        for round_ in range(10):
            job = a.post("/jobs", json={"type": "t", "cron": "@hourly"}).json()
            url = f"/jobs/{job['id']}"
            def patch(c: tuple[TestClient, int], url: str = url) -> Any:
                return c[0].patch(url, json={"priority": c[1]}, headers={"If-Match": "1"})

            with ThreadPoolExecutor(2) as pool:
                got = list(pool.map(patch, [(a, 5), (b, 6)]))
            assert sorted(g.status_code for g in got) == [200, 412], round_
            winner = next(g for g in got if g.status_code == 200).json()
            assert a.get(url).json()["priority"] == winner["priority"]
            assert winner["version"] == 2
