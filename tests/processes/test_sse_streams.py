"""The Server-Sent Events streams of a real `rsched api`: every state of 50 runs, in order, each
once, across a forced disconnect resumed from Last-Event-ID; a waiting GET /runs/{id}?wait
answers soon after the run ends."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
from support.api_process import Api, running_api
from support.helpers import Rig

from rsched import App, Client, JobContext, JobSpec
from rsched.core.ids import run_id as make_run_id
from rsched.core.settings import Settings

RUNS = 50


def _app() -> App:
    app = App("streams")

    @app.job("double")
    def double(ctx: JobContext) -> int:
        return int(ctx.payload["n"]) * 2

    return app


def _frames(api: Api, path: str, last_id: str | None, stop: Any) -> list[dict[str, Any]]:
    """Read SSE frames from ``path`` until ``stop(frames)``; each frame its id, event, data."""
    headers = {"Authorization": f"Bearer {api.read}"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    frames: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    with httpx.Client(base_url=api.base, timeout=60) as http, \
            http.stream("GET", path, headers=headers) as res:
        assert res.status_code == 200 and res.headers["content-type"].startswith(
            "text/event-stream")
        for line in res.iter_lines():
            if line.startswith(":"):
                continue
            if line == "":
                if frame:
                    frames.append(frame)
                    frame = {}
                    if stop(frames):
                        return frames
                continue
            name, _, value = line.partition(": ")
            frame[name] = json.loads(value) if name == "data" else value
    return frames


def _run_in_thread(redis_url: str, until: Any) -> threading.Thread:
    async def go() -> None:
        async with Rig(redis_url, _app()) as rig:
            deadline = time.monotonic() + 60
            while not until() and time.monotonic() < deadline:
                await rig.cycle()

    t = threading.Thread(target=lambda: asyncio.run(go()), daemon=True)
    t.start()
    return t


def test_every_state_of_50_runs_in_order_each_once_across_a_resumed_disconnect(
        redis_url: str, tmp_path: Path) -> None:
    with running_api(redis_url, tmp_path) as api:
        client = Client(settings=Settings.from_env(redis_url=redis_url))
        first: list[dict[str, Any]] = []
        connected = threading.Event()

        def read_first() -> None:
            def stop(fr: list[dict[str, Any]]) -> bool:
                connected.set()
                return len([f for f in fr if "id" in f]) >= 60
            first.extend(_frames(api, "/events?type=double", None, stop))

        reader = threading.Thread(target=read_first, daemon=True)
        reader.start()
        time.sleep(0.5)  # the stream is open (its first comment has come) before any event
        jobs = client.schedule_many([JobSpec("double", {"n": i}) for i in range(RUNS)])
        done = threading.Event()
        runner = _run_in_thread(redis_url, done.is_set)
        reader.join(60)
        assert not reader.is_alive() and first, "the first connection read nothing"
        last_id = [f["id"] for f in first if "id" in f][-1]

        def all_ended(fr: list[dict[str, Any]]) -> bool:
            ended = sum(1 for f in first + fr if f["event"] == "succeeded")
            return ended >= RUNS

        rest = _frames(api, "/events?type=double", last_id, all_ended)
        done.set()
        runner.join(30)
        client.close()
    frames = first + rest
    ids = [f["id"] for f in frames if "id" in f]
    assert len(ids) == len(set(ids)), "an event came twice"
    by_run: dict[str, list[str]] = defaultdict(list)
    for f in frames:
        if "runId" in f["data"]:
            by_run[f["data"]["runId"]].append(f["event"])
        else:
            assert f["event"] == "scheduled", f  # the jobs' creation: job events
    runs = {make_run_id(j.id, j.next_ms or 0) for j in jobs if not isinstance(j, Exception)}
    assert set(by_run) == runs
    for run_id, events in by_run.items():
        assert events == ["dispatched", "started", "succeeded"], (run_id, events)
    assert Counter(f["event"] for f in frames)["succeeded"] == RUNS
    assert all(f["data"]["type"] == "double" for f in frames)


def test_a_waiting_get_run_answers_soon_after_the_run_ends(
        redis_url: str, tmp_path: Path) -> None:
    with running_api(redis_url, tmp_path) as api:
        client = Client(settings=Settings.from_env(redis_url=redis_url))
        job = client.schedule("double", {"n": 4})
        run_id = make_run_id(job.id, job.next_ms or 0)
        answer: dict[str, Any] = {}

        def wait() -> None:
            with api.http(api.read) as http:
                answer.update(http.get(f"/runs/{run_id}", params={"wait": "10"}).json())
                answer["at"] = time.monotonic()

        waiter = threading.Thread(target=wait)
        waiter.start()
        with api.http(api.read) as http:  # another waiter on the partition, gone before the end
            short = http.get(f"/runs/{run_id}", params={"wait": "0.3"}).json()
        assert short["status"] == "dispatched"
        time.sleep(2.5)  # longer than a reader's blocking read: it must still be reading
        ended_at: list[float] = []

        async def run_it() -> None:
            async with Rig(redis_url, _app()) as rig:
                await rig.cycle()
                ended_at.append(time.monotonic())

        asyncio.run(run_it())
        waiter.join(15)
        client.close()
    assert answer["status"] == "succeeded" and answer["result"] == 8
    # The bound is 200 ms at light load; the machine running the suite is not.
    assert answer["at"] - ended_at[0] < 2.0, answer["at"] - ended_at[0]
