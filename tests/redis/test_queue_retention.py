"""How long finished jobs stay: per queue (RSCHED_QUEUE_RETENTION_MS) a queue's completed one-off
jobs and finished runs expire after its own time, other queues' after RSCHED_FINISHED_TTL_MS and
RSCHED_RUN_TTL_MS; a cancelled one-off job expires like a completed one."""

from __future__ import annotations

import asyncio

import pytest
import redis
from support.helpers import ManualClock, Rig

from rsched import App, Client, JobContext, JobStatus
from rsched.core.errors import ValidationError
from rsched.core.settings import Settings
from rsched.rdb import keys

BRIEF_MS = 60_000


def test_a_queues_retention_sets_how_long_its_finished_jobs_and_runs_stay(
        redis_url: str, client: Client, r: redis.Redis, clock: ManualClock) -> None:
    app = App("kept")

    @app.job("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    brief = client.schedule("ok", run_at=clock() - 1, queue="brief")
    usual = client.schedule("ok", run_at=clock() - 1)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock,
                       settings_overrides={"queue_retention_ms": (("brief", BRIEF_MS),)},
                       worker_kw={"queues": ["brief", "default"]}) as rig:
            for _ in range(3):
                await rig.cycle()

    asyncio.run(scenario())
    for job in (brief, usual):
        assert client.get(job.id).status is JobStatus.COMPLETED
    assert 0 < r.pttl(keys.job(brief.partition, brief.id)) <= BRIEF_MS
    assert BRIEF_MS < r.pttl(keys.job(usual.partition, usual.id)) <= client.settings.finished_ttl_ms


@pytest.mark.parametrize("raw", ["brief", "brief=soon", "=5", "brief=1,=2"])
def test_a_malformed_retention_names_the_variable(raw: str, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    monkeypatch.setenv("RSCHED_QUEUE_RETENTION_MS", raw)
    with pytest.raises(ValidationError, match="RSCHED_QUEUE_RETENTION_MS"):
        Settings.from_env()


def test_a_retention_per_queue_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("RSCHED_QUEUE_RETENTION_MS", "brief=1000, reports=0")
    s = Settings.from_env()
    assert s.retention_of("brief") == (1000, 1000) and s.retention_of("reports") == (0, 0)
    assert s.retention_of("default") == (s.run_ttl_ms, s.finished_ttl_ms)


def test_a_cancelled_one_off_job_expires_like_a_completed_one_and_a_recurring_one_stays(
        client: Client, r: redis.Redis) -> None:
    once = client.schedule("ok", run_at="2030-01-01T00:00:00Z")
    cron = client.schedule("ok", cron="0 3 * * *")
    for job in (once, cron):
        assert client.cancel(job.id).status is JobStatus.CANCELLED
    assert 0 < r.pttl(keys.job(once.partition, once.id)) <= client.settings.finished_ttl_ms
    assert r.pttl(keys.job(cron.partition, cron.id)) == -1
