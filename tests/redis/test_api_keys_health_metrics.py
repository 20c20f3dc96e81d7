"""API key names as the schema documents them, HEAD /healthz, the API's own metrics and the
cluster's runs-started counter, against the real app and the real session redis-server."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from support.helpers import Rig
from support.helpers import settings as _settings

from rsched import App, Client, JobContext, JobSpec
from rsched.api.app import create_app
from rsched.obs import metrics
from rsched.rdb import keys
from rsched.service.status import op_cluster


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


@pytest.mark.parametrize("name", ["ci", "deploy bot", "a@b.c:d-e_f", "x" * 64, "", "x" * 65,
                                  "no/slash", "tab\there", "line\n"])
def test_the_documented_key_name_pattern_is_the_one_the_api_enforces(
    api: TestClient, name: str
) -> None:
    pattern = api.get("/openapi.json").json()["components"]["schemas"]["ApiKeyCreate"][
        "properties"]["name"]["pattern"]
    # JSON Schema's pattern is an ECMA-262 search, whose $ (unlike Python's) is the very end
    documented = re.search(pattern.removesuffix("$") + r"\Z", name) is not None
    res = api.post("/api-keys", json={"name": name, "scope": "read"})
    assert res.status_code == (201 if documented else 422), (name, res.text)
    if not documented:
        assert res.json()["errors"][0]["field"] == "name"


def test_head_healthz_answers_200_with_gets_headers_and_no_body(api: TestClient) -> None:
    got, head = api.get("/healthz"), api.head("/healthz")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"] == "application/json"
    assert head.headers["content-length"] == str(len(got.content))
    wrong = api.post("/healthz")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD"


_SCRAPE = """
import sys
from starlette.testclient import TestClient
from rsched.api.app import create_app
from rsched.core.settings import Settings
from rsched.engine.dispatcher import Dispatcher
from prometheus_client.parser import text_string_to_metric_families
s = Settings.from_env(redis_url=sys.argv[1])
def names():
    with TestClient(create_app(s, auth=False)) as api:
        text = api.get("/metrics").text
    return sorted(f.name for f in text_string_to_metric_families(text)
                  if f.name.startswith("rsched_") and not f.name.endswith("_created"))
print(" ".join(names()))
Dispatcher(s)  # this process runs a dispatcher from now on
print(" ".join(names()))
"""
DISPATCHER_FAMILIES = {"rsched_dispatched", "rsched_skipped", "rsched_lease_changes",
                       "rsched_partitions_owned", "rsched_claim_round_seconds",
                       "rsched_events_trimmed"}


def test_the_apis_metrics_leave_out_dispatcher_counters_unless_it_runs_a_dispatcher(
    redis_url: str
) -> None:
    # a process of its own: this one has run dispatchers in other tests
    out = subprocess.run([sys.executable, "-c", _SCRAPE, redis_url], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    api_only, with_dispatcher = (set(line.split()) for line in out)
    assert "rsched_jobs_scheduled" in api_only and "rsched_workers" in api_only
    assert not api_only & DISPATCHER_FAMILIES
    assert with_dispatcher - api_only == DISPATCHER_FAMILIES


def _ok_app() -> App:
    app = App("started")

    @app.job("ok")
    def ok(ctx: JobContext) -> None:
        return None

    return app


def test_cluster_runs_started_does_not_drop_when_a_worker_dies(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    client.schedule_many([JobSpec(type="ok") for _ in range(5)])

    async def go() -> None:
        async with Rig(redis_url, _ok_app()) as rig:
            done = 0
            for _ in range(20):  # a fetch takes one entry per stream
                done += (await rig.cycle())[2]
                if done == 5:
                    break
            await rig.worker.heartbeat_once()
            await rig.worker.heartbeat_once()  # nothing new: adds nothing

    asyncio.run(go())
    assert client.run(op_cluster(client)).runs_started == 5
    r.hdel(keys.workers(), "w-test")  # the worker is gone (killed, then pruned)
    cluster = client.run(op_cluster(client))
    assert not cluster.status.workers
    text = metrics.render(cluster).decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}["rsched_cluster_runs_started"]
    assert [s.value for s in fam.samples if s.name.endswith("_total")] == [5]


def test_cluster_start_lag_keeps_a_dead_workers_share_and_adds_a_restarted_ones_once(
    redis_url: str, client: Client, r: redis.Redis
) -> None:
    """Each worker adds its new observations to Redis at each heartbeat: the figure does not
    lose a killed worker's runs, nor count a beat's twice."""

    async def run(n: int, worker_id: str) -> None:
        client.schedule_many([JobSpec(type="ok") for _ in range(n)])
        async with Rig(redis_url, _ok_app(), worker_id=worker_id) as rig:
            done = 0
            for _ in range(20):  # a fetch takes one entry per stream
                done += (await rig.cycle())[2]
                if done == n:
                    break
            await rig.worker.heartbeat_once()
            await rig.worker.heartbeat_once()  # nothing new: adds nothing

    def lag_count() -> float:
        cluster = client.run(op_cluster(client))
        fam = {f.name: f for f in text_string_to_metric_families(
            metrics.render(cluster).decode())}["rsched_cluster_start_lag_seconds"]
        [count] = [s.value for s in fam.samples if s.name.endswith("_count")]
        assert sum(cluster.start_lag[:-1]) == count and cluster.start_lag[-1] >= 0
        return count

    asyncio.run(run(4, "w-first"))
    assert lag_count() == 4
    r.hdel(keys.workers(), "w-first")  # killed, then pruned: its record is gone
    assert lag_count() == 4
    asyncio.run(run(3, "w-first"))  # the same worker id, restarted: its counts start at 0
    assert lag_count() == 7
