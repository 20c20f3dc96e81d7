"""Deleting dead letters, one by one and by filter (purge, with its dry run), through the HTTP API
and `rsched dlq`, against the real session redis-server and real dispatcher/worker loops."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient
from support.helpers import Rig, events, open_client
from support.helpers import settings as _settings

from rsched import App, Client, JobContext, RunState
from rsched.api.app import create_app
from rsched.cli.main import cli
from rsched.core import wire
from rsched.core.models import partition_of
from rsched.rdb import keys
from rsched.service import operations
from rsched.service.apikeys import op_create_key, op_list_keys
from rsched.service.listings import op_dead_letter_page

PROBLEM = "application/problem+json"
LATER = "2030-01-01T00:00:00Z"
LATER_MS = 1_893_456_000_000


def _app() -> App:
    app = App("dlq-test")

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")

    @app.job("kaput")
    def kaput(ctx: JobContext) -> None:
        raise ValueError("Disk Full")

    return app


def _run_due(redis_url: str, dead: int) -> None:
    """Dispatch and run what is due until ``dead`` dead letters exist (a cycle may miss a run
    the claim put in a stream after the worker's read): at most 20 cycles."""
    async def go(c: Client) -> None:
        async with Rig(redis_url, _app(), worker_kw={"queues": ("default", "disk")}) as rig:
            for _ in range(20):
                await rig.cycle()
                if len(c.run(op_dead_letter_page(c, 100)).items) >= dead:
                    return

    for c in open_client(redis_url):
        asyncio.run(go(c))


@pytest.fixture
def admin(redis_url: str) -> Iterator[tuple[TestClient, dict[str, str], Client]]:
    """The API with auth on, an admin key named "ops-alice", and a client."""
    c = Client(settings=_settings(redis_url))
    _, secret = c.run(op_create_key("ops-alice", "admin"))
    _, writer = c.run(op_create_key("writer", "write"))
    with TestClient(create_app(_settings(redis_url), key_cache_s=0)) as api:
        api.headers["Authorization"] = f"Bearer {secret}"
        yield api, {"write": writer}, c
    c.close()


def _dead_letters(api: TestClient, redis_url: str) -> dict[str, dict[str, Any]]:
    """Four dead letters: two one-off `boom` jobs (their own runs), a triggered `boom` run (a
    run hash of its own) and a `kaput` job on queue "disk"."""
    made = [api.post("/jobs", json={"type": "boom", "maxAttempts": 1}).json() for _ in range(2)]
    later = api.post("/jobs", json={"type": "boom", "maxAttempts": 1, "runAt": LATER}).json()
    assert api.post(f"/jobs/{later['id']}/trigger").status_code == 202
    api.post("/jobs", json={"type": "kaput", "maxAttempts": 1, "queue": "disk"})
    _run_due(redis_url, 4)
    letters = {d["runId"]: d for d in api.get("/dead-letters").json()["deadLetters"]}
    assert len(letters) == 4, letters
    assert {d["jobId"] for d in letters.values()} >= {j["id"] for j in made} | {later["id"]}
    return letters


def test_delete_removes_one_dead_letter_and_records_who_and_when_in_the_runs_history(
    admin: tuple[TestClient, dict[str, str], Client], redis_url: str, r: redis.Redis
) -> None:
    api, secrets, c = admin
    alice = next(f"{k.name} ({k.id})" for k in c.run(op_list_keys()) if k.name == "ops-alice")
    letters = _dead_letters(api, redis_url)
    later = [d for d in letters.values() if c.get(d["jobId"]).run_at_ms == LATER_MS]
    plain = later[0]  # the triggered run of the job due later
    own = next(d for d in letters.values() if d["type"] == "boom" and d not in later)
    res = api.delete(f"/dead-letters/{plain['runId']}",
                     headers={"Authorization": f"Bearer {secrets['write']}"})
    assert res.status_code == 403  # deleting needs admin, like replay
    for d in (own, plain):
        res = api.delete(f"/dead-letters/{d['runId']}")
        assert res.status_code == 204, res.text
        again = api.delete(f"/dead-letters/{d['runId']}")  # gone: a 404 naming the dead letter
        assert again.status_code == 404 and again.headers["content-type"] == PROBLEM
        runs = api.get(f"/jobs/{d['jobId']}/runs").json()["runs"]
        top = runs[0]
        assert (top["runId"], top["status"]) == (d["runId"], "deleted")
        assert top["error"] == f"deleted from the dead letters by {alice}"
        assert top["endedAt"] >= d["deadAt"]
        assert runs[1]["status"] == "failed" and "boom on attempt 1" in runs[1]["error"]
        p = partition_of(d["jobId"])
        ev = [e for e in events(r, p, job_id=d["jobId"]) if e["e"] == "dead_deleted"]
        assert len(ev) == 1 and ev[0][wire.EV_BY.decode()] == alice
        assert ev[0]["r"] == d["runId"]
    assert not r.exists(keys.run(partition_of(plain["jobId"]), plain["runId"]))
    assert c.get_run(own["runId"]).state is RunState.DELETED
    left = {d["runId"] for d in api.get("/dead-letters").json()["deadLetters"]}
    assert left == set(letters) - {own["runId"], plain["runId"]}
    assert api.get("/status").json()["deadLetters"] == 2
    replay = api.post(f"/dead-letters/{own['runId']}/replay")
    assert replay.status_code == 409 and "deleted" in replay.json()["detail"]
    assert api.post(f"/dead-letters/{plain['runId']}/replay").status_code == 404
    assert api.delete("/dead-letters/not-a-run").status_code == 404


def _purged(api: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    """POST /dead-letters/purge, then its operation followed to its end: dryRun and count."""
    res = api.post("/dead-letters/purge", json=body)
    assert res.status_code == 202, res.text
    op = res.json()
    assert res.headers["location"] == f"/operations/{op['id']}"
    deadline = time.monotonic() + 30
    while op["status"] == "running":
        assert time.monotonic() < deadline, op
        time.sleep(0.02)
        op = api.get(res.headers["location"]).json()
    assert op["status"] == "succeeded", op
    return {"dryRun": op["dryRun"], "count": op["matched"] if op["dryRun"] else op["deleted"]}


def test_purge_counts_on_a_dry_run_then_deletes_exactly_what_the_filter_matches(
    admin: tuple[TestClient, dict[str, str], Client], redis_url: str
) -> None:
    api, _, _ = admin
    letters = _dead_letters(api, redis_url)

    def purge(**body: Any) -> Any:
        return _purged(api, body)

    assert purge(dryRun=True) == {"dryRun": True, "count": 4}
    assert purge(dryRun=True, type="boom")["count"] == 3
    assert purge(dryRun=True, queue="disk")["count"] == 1
    assert purge(dryRun=True, errorContains="DISK full")["count"] == 1  # case-insensitive
    assert purge(dryRun=True, type="boom", errorContains="disk")["count"] == 0
    assert purge(dryRun=True, olderThanSeconds=3600)["count"] == 0
    assert purge(dryRun=True, olderThanSeconds=0)["count"] == 4
    assert len(api.get("/dead-letters").json()["deadLetters"]) == 4  # dry runs delete nothing
    listed = api.get("/dead-letters", params={"type": "boom"}).json()["deadLetters"]
    assert sorted(d["runId"] for d in listed) == sorted(
        k for k, d in letters.items() if d["type"] == "boom")
    assert api.get("/dead-letters", params={"olderThanSeconds": "3600"}).json() == {
        "deadLetters": [], "nextCursor": None}
    assert purge(dryRun=False, type="boom") == {"dryRun": False, "count": 3}
    left = api.get("/dead-letters").json()["deadLetters"]
    assert [d["type"] for d in left] == ["kaput"]
    assert purge(dryRun=False, type="boom")["count"] == 0
    assert purge(dryRun=False)["count"] == 1
    assert api.get("/dead-letters").json()["deadLetters"] == []


def test_a_purge_walks_more_dead_letters_than_one_chunk(
    admin: tuple[TestClient, dict[str, str], Client], redis_url: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    api, _, _ = admin
    _dead_letters(api, redis_url)
    for _ in range(3):
        api.post("/jobs", json={"type": "kaput", "maxAttempts": 1})
    _run_due(redis_url, 7)
    monkeypatch.setattr(operations, "PURGE_CHUNK", 2)  # 8 letters, a few partitions: many chunks
    body: dict[str, Any] = {"dryRun": True, "errorContains": "disk"}
    assert _purged(api, body)["count"] == 4
    body["dryRun"] = False
    assert _purged(api, body)["count"] == 4
    assert {d["type"] for d in api.get("/dead-letters").json()["deadLetters"]} == {"boom"}


@pytest.mark.parametrize(("body", "field"), [
    ({}, "dryRun"),
    ({"dryRun": "yes"}, "dryRun"),
    ({"dryRun": True, "olderThanSeconds": -1}, "olderThanSeconds"),
    ({"dryRun": True, "olderThanSeconds": True}, "olderThanSeconds"),
    ({"dryRun": True, "olderThanSeconds": 10**30}, "olderThanSeconds"),
    ({"dryRun": True, "type": "no spaces"}, "type"),
    ({"dryRun": True, "queue": 7}, "queue"),
    ({"dryRun": True, "errorContains": ""}, "errorContains"),
    ({"dryRun": True, "status": "dead"}, "status"),
])
def test_bad_purge_bodies_are_422_problems_naming_the_field(
    admin: tuple[TestClient, dict[str, str], Client], body: dict[str, Any], field: str
) -> None:
    api, _, _ = admin
    res = api.post("/dead-letters/purge", json=body)
    assert res.status_code == 422 and res.headers["content-type"] == PROBLEM, res.text
    assert res.json()["errors"][0]["field"] == field
    res = api.get("/dead-letters", params={"olderThanSeconds": "soon"})
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "olderThanSeconds"


# --- the CLI -------------------------------------------------------------------------------------


def _cli(redis_url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--redis-url", redis_url, "--log-level", "ERROR", *args],
                              catch_exceptions=False)


def test_rsched_dlq_delete_and_purge_with_dry_run(redis_url: str, r: redis.Redis) -> None:
    with TestClient(create_app(_settings(redis_url), auth=False)) as api:
        letters = _dead_letters(api, redis_url)
    boom = sorted(k for k, d in letters.items() if d["type"] == "boom")
    out = _cli(redis_url, "dlq", "delete", boom[0], "1-nope@1")
    assert out.exit_code == 1
    assert out.stdout == f"{boom[0]} deleted\n"
    assert "1-nope@1: not a dead letter" in out.stderr
    job_id = letters[boom[0]]["jobId"]
    for c in open_client(redis_url):
        attempts = c.runs(job_id)
        assert (attempts[0].status, attempts[0].error) == (
            "deleted", "deleted from the dead letters by cli")
    dry = _cli(redis_url, "dlq", "purge", "--type", "boom", "--dry-run")
    assert dry.exit_code == 0 and dry.stdout == "2 dead letters would be deleted\n"
    as_json = _cli(redis_url, "dlq", "purge", "--error-contains", "disk", "--dry-run", "--json")
    got = json.loads(as_json.stdout)
    assert got == {"dryRun": True, "count": 1, "operation": got["operation"]}
    shown = json.loads(_cli(redis_url, "operations", "show", got["operation"], "--json").stdout)
    assert (shown["status"], shown["matched"], shown["who"]) == ("succeeded", 1, "cli")
    assert _cli(redis_url, "dlq", "purge", "--older-than", "3600").stdout == (
        "0 dead letters deleted\n")
    done = _cli(redis_url, "dlq", "purge", "--type", "boom")
    assert done.exit_code == 0 and done.stdout == "2 dead letters deleted\n"
    listed = json.loads(_cli(redis_url, "dlq", "list", "--json").stdout)["deadLetters"]
    assert [d["type"] for d in listed] == ["kaput"]
    bad = _cli(redis_url, "dlq", "purge", "--older-than", "-5")
    assert bad.exit_code == 2 and "--older-than" in bad.stderr
    bad = _cli(redis_url, "dlq", "purge", "--type", "a b")
    assert bad.exit_code == 2 and "--type" in bad.stderr


def test_the_archives_history_keeps_the_dead_attempt_and_the_deletion_event_does_not_add_one(
    admin: tuple[TestClient, dict[str, str], Client], redis_url: str, tmp_path: Any
) -> None:
    api, _, _ = admin
    letters = _dead_letters(api, redis_url)
    d = next(iter(letters.values()))
    assert api.delete(f"/dead-letters/{d['runId']}").status_code == 204
    archived = Client(settings=_settings(redis_url),
                      archive_url=f"sqlite:///{tmp_path / 'history.db'}")
    try:
        attempts = archived.runs(d["jobId"])  # Redis's events, folded as the archive does
    finally:
        archived.close()
    assert [(a.run_id, a.attempt, a.status, a.dead_lettered) for a in attempts
            if a.run_id == d["runId"]] == [(d["runId"], 1, "failed", True)]


def test_two_keys_of_the_same_name_are_told_apart_in_what_they_record(
    admin: tuple[TestClient, dict[str, str], Client],
) -> None:
    api, _, c = admin
    twin, twin_secret = c.run(op_create_key("ops-alice", "admin"))
    job = api.post("/jobs", json={"type": "t", "cron": "0 3 * * *"}).json()
    paused = api.post(f"/jobs/{job['id']}/pause").json()["pausedBy"]
    resumed = api.post(f"/jobs/{job['id']}/resume",
                       headers={"Authorization": f"Bearer {twin_secret}"}).json()["resumedBy"]
    assert resumed == f"ops-alice ({twin.id})"
    assert paused.startswith("ops-alice (key_") and paused != resumed
