"""Following runs from the events streams: Client.wait and result, GET /runs/{id}?wait, a job's
events (Client.events), `rsched runs wait` exit codes and `rsched runs show`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from starlette.testclient import TestClient
from support.cli import as_json, run_main
from support.helpers import Rig
from support.helpers import settings as _settings

from rsched import App, AsyncClient, Client, Job, JobContext
from rsched.api.app import create_app
from rsched.core.errors import NotFound, RunFailed, ValidationError
from rsched.core.ids import run_id as make_run_id
from rsched.core.models import RunState


def _app() -> App:
    app = App("follow")

    @app.job("double")
    def double(ctx: JobContext) -> dict[str, int]:
        return {"n": ctx.payload["n"] * 2}

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    return app


def _run_soon(redis_url: str, delay_s: float = 0.3, cycles: int = 5) -> threading.Thread:
    """Dispatch and run what is due after ``delay_s``, in a thread of its own."""
    async def go() -> None:
        await asyncio.sleep(delay_s)
        async with Rig(redis_url, _app()) as rig:
            for _ in range(cycles):
                await rig.cycle()

    t = threading.Thread(target=lambda: asyncio.run(go()))
    t.start()
    return t


def test_wait_returns_the_run_once_it_ends_and_result_its_value(
        client: Client, redis_url: str) -> None:
    soon = datetime.fromtimestamp(client.now_ms() / 1000 + 0.5, UTC)
    job = client.schedule("double", {"n": 21}, run_at=soon)
    run_id = make_run_id(job.id, job.next_ms or 0)
    with pytest.raises(TimeoutError, match="not dispatched yet"):  # a run to come ...
        client.wait(run_id, timeout=0.05)
    runner = _run_soon(redis_url, 0.8)
    t0 = time.monotonic()
    assert client.result(job, timeout=30) == {"n": 42}  # ... which result waits for
    assert time.monotonic() - t0 >= 0.5
    runner.join()
    done = client.wait(run_id, timeout=1)
    assert (done.state, done.result) == (RunState.SUCCEEDED, {"n": 42})
    with pytest.raises(NotFound):  # not the job's occurrence: no such run
        client.wait(make_run_id(job.id, 1), timeout=0.05)


def test_result_of_a_run_that_fails_for_good_raises_run_failed(
        client: Client, redis_url: str) -> None:
    job = client.schedule("boom", max_attempts=1)
    runner = _run_soon(redis_url, 0.1)
    with pytest.raises(RunFailed, match="ended dead: RuntimeError: boom"):
        client.result(job.id, timeout=30)
    runner.join()


def test_the_job_schedule_answers_waits_for_its_own_result(
        client: Client, redis_url: str) -> None:
    job = client.schedule("double", {"n": 8})
    assert isinstance(job, Job) and job.type == "double"  # the Job, with result()
    with pytest.raises(TimeoutError, match="has not ended within 0.05 s"):
        job.result(timeout=0.05)  # dispatched, not run yet: nobody runs it
    bad = client.schedule("boom", max_attempts=1)
    runner = _run_soon(redis_url, 0.2)
    assert job.result(timeout=30) == {"n": 16}
    with pytest.raises(RunFailed, match="ended dead: RuntimeError: boom"):
        bad.result(timeout=30)
    runner.join()
    recurring = client.schedule("double", {"n": 1}, cron="0 3 * * *")
    assert recurring == client.get(recurring.id)  # equal to the same job read back
    with pytest.raises(ValidationError, match="recurring"):
        recurring.result(timeout=0.05)


def test_the_async_job_schedule_answers_awaits_its_result(redis_url: str) -> None:
    async def go() -> Any:
        c = AsyncClient(settings=_settings(redis_url))
        try:
            job = await c.schedule("double", {"n": 50})
            assert (await c.get(job.id)).type == job.type == "double"
            waiting = asyncio.create_task(job.result(timeout=30))
            async with Rig(redis_url, _app()) as rig:
                await rig.cycle()
            return await waiting
        finally:
            await c.close()

    assert asyncio.run(go()) == {"n": 100}


def test_the_async_client_waits_and_iterates_events(redis_url: str) -> None:
    async def go() -> tuple[Any, list[str]]:
        c = AsyncClient(settings=_settings(redis_url))
        try:
            job = await c.schedule("double", {"n": 2}, run_at="2030-01-01T00:00:00Z")
            seen: list[str] = []

            async def watch() -> None:
                async for ev in c.events(job.id):
                    seen.append(ev["event"])
                    if ev["event"] == "succeeded":
                        return

            watching = asyncio.create_task(watch())
            await asyncio.sleep(0.2)
            run_id = await c.trigger(job.id)
            async with Rig(redis_url, _app()) as rig:
                await rig.cycle()
            run = await c.wait(run_id, timeout=30)
            await asyncio.wait_for(watching, 30)
            return run.result, seen
        finally:
            await c.close()

    result, seen = asyncio.run(go())
    assert result == {"n": 4}
    assert seen == ["triggered", "dispatched", "started", "succeeded"], seen


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as c:
        yield c


def test_get_run_waits_for_the_end_without_polling(api: TestClient, client: Client,
                                                   redis_url: str) -> None:
    job = client.schedule("double", {"n": 5})
    run_id = make_run_id(job.id, job.next_ms or 0)
    waiting = api.get(f"/runs/{run_id}", params={"wait": "0.2"}).json()
    assert waiting["status"] == "dispatched"  # created due: sent to its queue at once
    runner = _run_soon(redis_url, 0.3)
    t0 = time.monotonic()
    ended = api.get(f"/runs/{run_id}", params={"wait": "30"}).json()
    assert time.monotonic() - t0 < 20
    runner.join()
    assert (ended["status"], ended["result"]) == ("succeeded", {"n": 10})
    for bad in ("-1", "61", "soon"):
        res = api.get(f"/runs/{run_id}", params={"wait": bad})
        assert res.status_code == 422 and res.json()["errors"][0]["field"] == "wait"
    assert api.get("/runs/nope").status_code == 404
    for path in (f"/jobs/{job.id}/events", "/events"):  # refused before any event is sent
        refused = api.get(path, headers={"Last-Event-ID": "12;3.x-1"})
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["field"] == "Last-Event-ID"
    assert api.get("/events", params={"queue": "no spaces"}).status_code == 422
    # A job's next occurrence, not dispatched yet: a wait waits for its dispatch and end too.
    soon = datetime.fromtimestamp(client.now_ms() / 1000 + 0.5, UTC)
    later = client.schedule("double", {"n": 6}, run_at=soon)
    pending = make_run_id(later.id, later.next_ms or 0)
    gone = api.get(f"/runs/{pending}", params={"wait": "0.05"})
    assert gone.status_code == 404 and "not dispatched yet" in gone.json()["detail"]
    runner = _run_soon(redis_url, 0.8)
    assert api.get(f"/runs/{pending}", params={"wait": "30"}).json()["result"] == {"n": 12}
    runner.join()


def test_runs_wait_exits_0_on_success_1_on_a_dead_letter_124_on_timeout(
        client: Client, redis_url: str) -> None:
    later = client.schedule("double", {"n": 1}, run_at="2030-01-01T00:00:00Z")
    pending = client.trigger(later.id)
    with pytest.raises(TimeoutError, match="has not ended within 0.05 s"):
        client.wait(pending, timeout=0.05)
    slow = run_main(redis_url, "runs", "wait", pending, "--timeout", "0.2")
    assert slow.returncode == 124 and "has not ended within 0.2 s" in slow.stderr
    ok = client.schedule("double", {"n": 3})
    bad = client.schedule("boom", max_attempts=1)
    _run_soon(redis_url, 0).join()
    done = run_main(redis_url, "runs", "wait", make_run_id(ok.id, ok.next_ms or 0), "--json")
    assert done.returncode == 0 and '"status": "succeeded"' in done.stdout
    dead = run_main(redis_url, "runs", "wait", make_run_id(bad.id, bad.next_ms or 0))
    assert dead.returncode == 1 and "dead" in dead.stdout
    shown = as_json(redis_url, "runs", "show", make_run_id(ok.id, ok.next_ms or 0))
    assert shown["result"] == {"n": 6}
    missing = run_main(redis_url, "runs", "wait", "3-NOPE@1")
    assert missing.returncode == 1 and "not found" in missing.stderr
