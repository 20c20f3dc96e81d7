"""Progress from handlers (ctx.progress): kept with the run and sent as an event, batched (a
tight loop adds no Redis call per call), fenced like every write of the attempt."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from support.helpers import Rig

from rsched import App, Client, JobContext
from rsched.archive.events import decode
from rsched.core.handlers import JobContext as Ctx
from rsched.core.ids import run_id as make_run_id
from rsched.rdb import keys, scripts
from rsched.service.shapes import event_json


def _app(gate: threading.Event) -> App:
    app = App("progress")

    @app.job("steps")
    def steps(ctx: JobContext) -> str:
        for i in range(1, 11):
            ctx.progress(i * 10, f"step {i}")
            time.sleep(0.2)
        gate.wait(10)
        return "done"

    @app.job("spin")
    async def spin(ctx: JobContext) -> int:
        for i in range(20_000):  # a tight loop: the reports are batched
            ctx.progress({"done": i})
        return 1

    return app


def test_progress_shows_on_the_run_while_it_runs_and_a_tight_loop_costs_few_calls(
        client: Client, redis_url: str, r: redis.Redis) -> None:
    gate = threading.Event()
    job = client.schedule("steps", {})
    spin = client.schedule("spin", {})
    run_id = make_run_id(job.id, job.next_ms or 0)
    seen: list[Any] = []

    async def go() -> None:
        async with Rig(redis_url, _app(gate), worker_kw={"concurrency": 4}) as rig:
            task = asyncio.create_task(rig.worker.run(stop := asyncio.Event()))
            await rig.claim()
            deadline = time.monotonic() + 20
            while len({p["value"] for p in seen if p}) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                seen.append(client.get_run(run_id).progress)
            gate.set()
            while client.get_run(run_id).state.value != "succeeded":
                assert time.monotonic() < deadline + 10
                await asyncio.sleep(0.1)
            stop.set()
            await task

    r.config_resetstat()
    asyncio.run(go())
    values = [p["value"] for p in seen if p]
    assert len(set(values)) >= 3 and values == sorted(values), seen
    # The last report may go unsent when the run ends within PROGRESS_EVERY_S of it.
    last = client.get_run(run_id).progress
    assert last["value"] >= max(values) and last["message"] == f"step {last['value'] // 10}"
    # The SSE streams' shape of a progress event carries the report.
    p = int(job.id.split("-")[0])
    entries: list[tuple[bytes, dict[bytes, bytes]]] = r.xrange(keys.events(p))  # type: ignore[assignment]
    shown = [event_json(eid.decode(), decode(p, eid, f)) for eid, f in entries
             if f.get(b"e") == b"progress" and f.get(b"r") == run_id.encode()]
    assert shown and shown[0]["progress"]["value"] == values[0]
    assert shown[0]["progress"]["message"] == f"step {values[0] // 10}"
    heartbeats = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    assert heartbeats < 500  # 20,000 reports of the tight loop, and the rest of the round
    events = r.xrange(keys.events(int(spin.id.split("-")[0]))) or []
    assert sum(1 for _, f in events if f and f.get(b"e") == b"progress") < 100


def test_progress_of_a_stale_attempt_is_not_written(client: Client, r: redis.Redis) -> None:
    """heartbeat.lua writes progress only under the run's own fence (a reclaimed attempt's
    late report changes nothing)."""
    job = client.schedule("steps", {}, run_at="2030-01-01T00:00:00Z")
    run_id = make_run_id(job.id, job.next_ms or 0)
    p = int(job.id.split("-")[0])
    r.xgroup_create(keys.stream(p, "default"), keys.GROUP, mkstream=True)
    r.hset(keys.job(p, job.id), mapping={"o": run_id, "rs": "running", "rw": "w-new",
                                         "rf": 2, "ri": "1-0"})
    call = ("heartbeat", [keys.events(p), keys.stats(p), keys.job(p, job.id), keys.job(p, job.id),
                          keys.stream(p, "default")],
            ["w-old", 0, keys.GROUP, 1, 0, run_id, 1, "1-0", '{"value":50}'])
    scripts.call(r, *call)
    assert client.get_run(run_id).progress is None


@pytest.mark.parametrize("value", [-1, 101, True, "half", float("nan")])
def test_a_bad_progress_value_is_refused(value: Any) -> None:
    ctx = Ctx("1-x", "1-x@1", "t", 1, 1, None, "w")
    with pytest.raises(ValueError, match="progress"):
        ctx.progress(value)
    with pytest.raises(ValueError, match="500 characters"):
        ctx.progress(5, "m" * 501)
