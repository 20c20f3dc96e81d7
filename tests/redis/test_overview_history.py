"""The overview's history: the API samples the cluster's counters into Redis, and
GET /stats/overview answers the last hour of samples (real redis-server, real engine loops)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.helpers import Rig, open_client
from support.helpers import settings as _settings

from rsched import App, JobContext
from rsched.api.app import create_app
from rsched.core.errors import ValidationError
from rsched.core.settings import Settings
from rsched.rdb import keys
from rsched.service.samples import SAMPLES_KEY, op_record, op_samples

SAMPLE_MS = 200


def _run_jobs(redis_url: str, api: TestClient, n: int) -> None:
    app = App("history-test")

    @app.job("ok")
    def ok(ctx: JobContext) -> None:
        return None

    for i in range(n):
        api.post("/jobs", json={"type": "ok", "payload": {"i": i}})

    async def go() -> None:
        async with Rig(redis_url, app) as rig:
            for _ in range(20):
                await rig.cycle()
                done = api.get("/jobs", params={"status": "completed"}).json()["jobs"]
                if len(done) >= n:
                    return

    asyncio.run(go())


def _samples(api: TestClient, wanted: int) -> list[dict[str, Any]]:
    """Wait (at most 30 s, 150 sampling periods) for ``wanted`` samples."""
    deadline = time.monotonic() + 30
    while True:
        res = api.get("/stats/overview")
        assert res.status_code == 200, res.text
        got: list[dict[str, Any]] = res.json()["samples"]
        if len(got) >= wanted or time.monotonic() > deadline:
            return got
        time.sleep(SAMPLE_MS / 1000)


def test_the_api_samples_the_counters_and_answers_them_oldest_first(
    redis_url: str, r: redis.Redis
) -> None:
    settings = replace(_settings(redis_url), stats_sample_ms=SAMPLE_MS)
    with TestClient(create_app(settings, auth=False)) as api:
        assert api.get("/stats/overview").json()["sampleSeconds"] == SAMPLE_MS / 1000
        first = _samples(api, 2)
        _run_jobs(redis_url, api, 5)
        start = first[-1]["t"]
        got = _samples(api, len(first) + 3)
        assert len(got) >= len(first) + 3, got
        ts = [s["t"] for s in got]
        assert ts == sorted(set(ts)) and all(t % SAMPLE_MS == 0 for t in ts)
        later = [s for s in got if s["t"] > start]
        partitions = int(r.hget(keys.config(), "partitions") or 0)
        succeeded = sum(int(r.hget(keys.stats(p), "succeeded") or 0) for p in range(partitions))
        assert succeeded == 5
        assert later[-1]["succeeded"] - first[-1]["succeeded"] == 5
        assert later[-1]["due"] == 0 and later[-1]["failed"] == 0
        lag = later[-1]["lag"]
        assert lag[-1][0] is None and [c for _, c in lag] == sorted(c for _, c in lag)
        for q in ({"minutes": "0"}, {"minutes": "121"}, {"minutes": "soon"}):
            res = api.get("/stats/overview", params=q)
            assert res.status_code == 422 and res.json()["errors"][0]["field"] == "minutes"


def test_samples_of_one_bucket_are_answered_once_and_old_ones_are_trimmed(
    redis_url: str, r: redis.Redis
) -> None:
    for c in open_client(redis_url):
        c.settings = replace(c.settings, stats_sample_ms=3_600_000)  # one bucket for the test
        old = {"t": 0, "started": 0, "succeeded": 0, "failed": 0, "lag": [], "due": 0,
               "retry": 0, "oldest": 0}
        r.zadd(SAMPLES_KEY, {json.dumps(old): 0})
        a = c.run(op_record(c))
        b = c.run(op_record(c))  # the same bucket, as a second API process would
        assert a["t"] == b["t"]
        # t is the bucket's start, at when the counters were read: what a rate divides by.
        now = c.now_ms()
        assert a["t"] <= a["at"] <= b["at"] <= now and now - a["at"] < 5_000
        assert r.zcard(SAMPLES_KEY) in (1, 2)  # equal samples are one member
        assert c.run(op_samples(c, 0)) in ([a], [b])  # the 1970 sample was trimmed


def test_a_bad_sample_period_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RSCHED_STATS_SAMPLE_MS", "10")
    with pytest.raises(ValidationError, match="RSCHED_STATS_SAMPLE_MS"):
        Settings.from_env()
