"""The archive's read path through the HTTP API, the CLI and the Python client, end to end.

A real dispatcher and worker (``Rig``) run a job's attempts against the session redis-server; a
real archiver moves part of the events into SQLite or Postgres and trims them from Redis.  Every
face must then show one history: each attempt exactly once, newest first, across pages, whether
its events sit in the archive, in Redis, or (committed, not yet trimmed) in both.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import redis
import schemathesis
from click.testing import CliRunner
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.testclient import TestClient
from support.archive import archive_url, store  # noqa: F401 - the two-store fixtures
from support.helpers import ManualClock, Rig, redis_now_ms, settings, summary
from support.live_api import MAX_EXAMPLES, LiveAPI
from support.redis_server import RedisServer

from rsched import App, Client, JobContext
from rsched.api.app import create_app
from rsched.api.openapi import document
from rsched.archive import Archiver, ArchiverConfig, Store, open_store
from rsched.cli.main import cli
from rsched.rdb import keys
from rsched.service.apikeys import op_create_key

HISTORY_LEN = 2  # Redis keeps two finished attempts per job: the archive must keep the rest
PROBLEM = "application/problem+json"


def handlers(calls: list[int]) -> App:
    app = App("archive-api")

    @app.job("flaky")
    def flaky(ctx: JobContext) -> dict[str, int]:
        calls.append(ctx.attempt)
        if len(calls) <= 2:  # the first run fails twice, then everything succeeds
            raise RuntimeError(f"boom {len(calls)}")
        return {"n": len(calls)}

    return app


class Engine:
    """A job driven through real attempts: its first run retried twice, then triggered runs."""

    def __init__(self, redis_url: str, r: redis.Redis) -> None:
        self.redis_url = redis_url
        self.calls: list[int] = []
        self.clock = ManualClock(redis_now_ms(r))
        self.client = Client(settings=settings(redis_url, history_len=HISTORY_LEN))
        self.job = self.client.schedule("flaky", run_at=self.clock() - 1, max_attempts=3,
                                        backoff_base_ms=1000)
        self.runs = [f"{self.job.id}@{self.job.next_ms}"]  # oldest first

    def run(self, triggers: int = 0) -> None:
        """``triggers`` runs, one at a time, then every attempt due (retries included)."""
        async def go() -> None:
            async with Rig(self.redis_url, handlers(self.calls), clock=self.clock,
                           settings_overrides={"history_len": HISTORY_LEN}) as rig:
                for _ in range(triggers):
                    self.runs.append(self.client.trigger(self.job.id))
                    await rig.cycle()
                for _ in range(4):
                    self.clock.advance(60_000)  # past any retry's backoff
                    await rig.cycle()

        asyncio.run(go())

    def history(self) -> list[tuple[str, int, str]]:
        """(runId, attempt, status) of every attempt so far, newest first."""
        first, *triggered = self.runs
        return [(rid, 1, "succeeded") for rid in reversed(triggered)] + [
            (first, 3, "succeeded"), (first, 2, "failed"), (first, 1, "failed")]


@pytest.fixture
def engine(redis_url: str, r: redis.Redis) -> Iterator[Engine]:
    e = Engine(redis_url, r)
    try:
        e.run()
        e.run(triggers=3)
        assert len(e.calls) == 6
        yield e
    finally:
        e.client.close()


def api(redis_url: str, archive: str | None) -> TestClient:
    return TestClient(create_app(settings(redis_url), auth=False, archive_url=archive))


def walk(http: TestClient, job_id: str, limit: int) -> list[dict[str, Any]]:
    """Every page of GET /jobs/{id}/runs, concatenated."""
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    for _ in range(100):
        res = http.get(f"/jobs/{job_id}/runs", params=params)
        assert res.status_code == 200, res.text
        body = res.json()
        assert len(body["runs"]) <= limit and body["partial"] is False
        out += body["runs"]
        if body["nextCursor"] is None:
            return out
        params["cursor"] = body["nextCursor"]
    raise AssertionError("pagination did not end")


def identity(runs: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return [(x["runId"], x["attempt"], x["status"]) for x in runs]


def events_in_redis(r: redis.Redis, partitions: int) -> int:
    return sum(r.xlen(keys.events(p)) for p in range(partitions))


def test_runs_show_every_attempt_once_whether_archived_trimmed_or_still_in_redis(
    engine: Engine, r: redis.Redis, redis_url: str, archive_url: str, store: Store,  # noqa: F811
) -> None:
    job_id, want = engine.job.id, engine.history()
    with api(redis_url, None) as plain:  # no archive configured: what Redis keeps
        body = plain.get(f"/jobs/{job_id}/runs").json()
        # The one-off job's own run keeps its 3 attempts in the job hash; the triggered runs'
        # attempts are in the history list, trimmed to HISTORY_LEN.
        assert set(body) == {"runs", "nextCursor"} and len(body["runs"]) == 3 + HISTORY_LEN

    partitions = engine.client.partitions
    archiver = Archiver(r, store, partitions, ArchiverConfig(batch=5))
    archiver.setup()
    with api(redis_url, archive_url) as http:
        assert identity(walk(http, job_id, 50)) == want  # nothing archived yet

        before = events_in_redis(r, partitions)
        archiver.run_once()  # part archived and trimmed, the rest only in Redis
        assert 0 < events_in_redis(r, partitions) < before
        for limit in (1, 2, 4, 50):
            assert identity(walk(http, job_id, limit)) == want

        crashed = Archiver(r, store, partitions, ArchiverConfig(batch=3))
        crashed.commit(crashed.read())  # committed, never acknowledged: in both places at once
        assert identity(walk(http, job_id, 2)) == want

        while archiver.run_once().read:
            pass
        runs = walk(http, job_id, 3)
        assert identity(runs) == want and all(x["archived"] for x in runs)
        newest, oldest = runs[0], runs[-1]
        assert newest["result"] == {"n": 6} and newest["worker"] == "w-test"
        assert (newest["jobId"], newest["type"], newest["queue"]) == (job_id, "flaky", "default")
        assert newest["endedAt"] >= newest["startedAt"] and newest["dispatchedAt"] is not None
        assert summary(oldest["error"]) == "RuntimeError: boom 1" and oldest["retryAt"] is not None
        assert oldest["durationMs"] is not None and oldest["replays"] == 0

        engine.run(triggers=1)  # a new attempt whose events are only in Redis
        latest = walk(http, job_id, 2)
        assert identity(latest) == engine.history()
        assert latest[0]["archived"] is False and all(x["archived"] for x in latest[1:])
        assert latest[0]["result"] == {"n": 7}


def test_the_python_client_and_the_cli_read_the_same_merged_history(
    engine: Engine, r: redis.Redis, redis_url: str, archive_url: str, store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id, want = engine.job.id, engine.history()
    archiver = Archiver(r, store, engine.client.partitions, ArchiverConfig(batch=7))
    archiver.setup()
    archiver.run_once()
    client = Client(settings=settings(redis_url), archive_url=archive_url)
    try:
        got = [(a.run_id, a.attempt, a.status) for a in client.runs(job_id)]
        assert got == want
        assert [(a.run_id, a.attempt) for a in client.runs(job_id, limit=2, offset=3)] \
            == [x[:2] for x in want[3:5]]
        page = client.history(job_id, limit=4)
        rest = client.history(job_id, limit=4, cursor=page.next_cursor)
        assert [(a.run_id, a.attempt, a.status) for a in page.items + rest.items] == want
        assert rest.next_cursor is None
    finally:
        client.close()

    monkeypatch.setenv("RSCHED_ARCHIVE_URL", archive_url)
    res = CliRunner().invoke(cli, ["--redis-url", redis_url, "jobs", "runs", job_id, "--json",
                                   "--limit", "100"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert identity(json.loads(res.stdout)["runs"]) == want
    table = CliRunner().invoke(cli, ["--redis-url", redis_url, "jobs", "runs", job_id],
                               catch_exceptions=False).stdout
    assert sum(job_id in line for line in table.splitlines()) == len(want)


# --- run-level queries ----------------------------------------------------------------------------


def test_failures_and_duration_percentiles_of_a_type_over_http_and_the_cli(
    engine: Engine, r: redis.Redis, redis_url: str, archive_url: str, store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    archiver = Archiver(r, store, engine.client.partitions, ArchiverConfig())
    archiver.setup()
    while archiver.run_once().read:
        pass
    first = engine.runs[0]
    since = "2000-01-01T00:00:00Z"
    with api(redis_url, archive_url) as http:
        res = http.get("/stats/failures", params={"type": "flaky", "from": since, "limit": 1})
        assert res.status_code == 200, res.text
        page1 = res.json()
        page2 = http.get("/stats/failures", params={"type": "flaky", "from": since, "limit": 1,
                                                    "cursor": page1["nextCursor"]}).json()
        fails = page1["failures"] + page2["failures"]
        assert [(f["runId"], f["attempt"], f["status"], summary(f["error"])) for f in fails] == [
            (first, 2, "failed", "RuntimeError: boom 2"),
            (first, 1, "failed", "RuntimeError: boom 1")]
        assert page2["nextCursor"] is None and fails[0]["at"] > fails[1]["at"]
        none = http.get("/stats/failures", params={"type": "other", "from": since}).json()
        assert none["failures"] == [] and none["type"] == "other"

        report = http.get("/stats/durations", params={"from": since}).json()
        (flaky,) = report["types"]
        assert (flaky["type"], flaky["count"], flaky["failed"]) == ("flaky", 6, 2)
        p = flaky["percentiles"]
        assert 0 <= p["p50"] <= p["p90"] <= p["p95"] <= p["p99"] == flaky["maxMs"]
        assert report["from"] == "2000-01-01T00:00:00.000Z" and report["to"] is None
        future = http.get("/stats/durations", params={"from": "2999-01-01T00:00:00Z"}).json()
        assert future["types"] == []

    monkeypatch.setenv("RSCHED_ARCHIVE_URL", archive_url)
    out = CliRunner().invoke(cli, ["--redis-url", redis_url, "stats", "durations", "--json",
                                   "--from", since], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == report["types"]
    out = CliRunner().invoke(cli, ["--redis-url", redis_url, "stats", "failures", "--type",
                                   "flaky", "--from", since, "--json"], catch_exceptions=False)
    assert json.loads(out.stdout)["failures"] == fails


def problem_of(res: Any, status: int, field: str | None = None) -> dict[str, Any]:
    assert res.status_code == status, res.text
    assert res.headers["content-type"] == PROBLEM
    body: dict[str, Any] = res.json()
    if field is not None:
        assert body["errors"][0]["field"] == field
    return body


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/stats/failures", {"type": "bad type!"}, "type"),
    ("/stats/failures", {"from": "yesterday"}, "from"),
    ("/stats/failures", {"to": "2020-01-01"}, "to"),
    ("/stats/failures", {"from": "2020-01-02T00:00:00Z", "to": "2020-01-01T00:00:00Z"}, "from"),
    ("/stats/failures", {"limit": 0}, "limit"),
    ("/stats/failures", {"cursor": "1.2.\u00b2"}, "cursor"),
    ("/stats/failures", {"cursor": "99999999999999999999.1.1"}, "cursor"),
    ("/stats/durations", {"type": ""}, "type"),
    ("/stats/durations", {"to": "1970-01-01T00:00:00Z"}, "from"),
    ("/jobs/1-NOPE/runs", {"cursor": "garbage"}, "cursor"),
    ("/jobs/1-NOPE/runs", {"limit": 1001}, "limit"),
])
def test_bad_stats_and_runs_parameters_are_422_naming_the_field(
    redis_url: str, tmp_path: Path, path: str, params: dict[str, Any], field: str
) -> None:
    with api(redis_url, f"sqlite:///{tmp_path}/a.db") as http:
        problem_of(http.get(path, params=params), 422, field)


def test_without_an_archive_stats_are_404_and_an_unreachable_one_is_503(
    redis_url: str, tmp_path: Path, engine: Engine
) -> None:
    with api(redis_url, None) as http:
        body = problem_of(http.get("/stats/durations"), 404)
        assert "RSCHED_ARCHIVE_URL" in body["detail"]
        problem_of(http.get("/stats/failures"), 404)
    with api(redis_url, f"sqlite:///{tmp_path}/a.db") as http:
        problem_of(http.get("/jobs/3-NOSUCHJOB/runs"), 404)  # unknown here and in the archive
    broken = f"sqlite:///{tmp_path}/no/such/dir/a.db"
    with api(redis_url, broken) as http:
        for path in ("/stats/durations", "/stats/failures", f"/jobs/{engine.job.id}/runs"):
            body = problem_of(http.get(path), 503)
            assert "archive is unavailable" in body["detail"]


# --- fuzzing the archive's routes ----------------------------------------------------------------


@pytest.fixture(scope="module")
def live_archive(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[str, str]]:
    """The real API (uvicorn, auth on) over a SQLite archive holding a job's history."""
    redis_server.resume()
    url = f"sqlite:///{tmp_path_factory.mktemp('archive')}/fuzz.db"
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushall()
        e = Engine(redis_server.url, r)
        try:
            e.run()
            _, secret = e.client.run(op_create_key("fuzz", "read"))
        finally:
            e.client.close()
        archiver = Archiver(r, open_store(url), e.client.partitions, ArchiverConfig(batch=4))
        archiver.setup()
        archiver.run_once()
        archiver.store.close()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RSCHED_ARCHIVE_URL", url)
        with LiveAPI(settings(redis_server.url)) as live:
            yield f"http://127.0.0.1:{live.port}", secret


archive_schema = schemathesis.openapi.from_dict(document(auth=True)).include(
    path_regex=r"^/(stats/|jobs/\{id\}/runs)")
# Every request carries the test's key (call_and_validate's headers): a case made negative by
# leaving the key out would be sent with it, and then wrongly expected to be refused.
archive_schema.config.generation.update(with_security_parameters=False)


@archive_schema.parametrize()
@hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
def test_no_request_to_the_archive_routes_yields_a_server_error(
    # type-arg: Case is generic in schemathesis' own operation type.  The annotation stays bare:
    # hypothesis seeds derandomized runs from the signature, so naming it would change the cases.
    case: schemathesis.Case, live_archive: tuple[str, str]  # type: ignore[type-arg]
) -> None:
    base, secret = live_archive
    case.call_and_validate(base_url=base, headers={"Authorization": f"Bearer {secret}"},
                           excluded_checks=[positive_data_acceptance])
