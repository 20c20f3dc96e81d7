"""`rsched doctor`'s projection of Redis's memory (rsched.service.memory): the scheduled backlog at
its sampled jobs' MEMORY USAGE, finished jobs at the overview's rate for RSCHED_FINISHED_TTL_MS,
the events streams at their bound or at what an archiver has not read, and the dead letters."""

from __future__ import annotations

import json
from typing import cast

import redis
from starlette.testclient import TestClient
from support.cli import as_json
from support.helpers import settings

from rsched import Client, JobSpec
from rsched.api.app import create_app
from rsched.core import defaults
from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.shared_keys import op_add_sample
from rsched.service.memory import MemoryPart, op_projection


def _parts(client: Client) -> dict[str, MemoryPart]:
    return {p.part: p for p in client.run(op_projection(client, client.partitions))}


def test_the_projection_multiplies_what_redis_holds_by_what_it_measures(
        client: Client, r: redis.Redis) -> None:
    jobs = client.schedule_many([JobSpec("t", {"n": i}, run_at="2030-01-01T00:00:00Z")
                                 for i in range(300)])
    parts = _parts(client)
    sampled = [int(r.memory_usage(keys.job(p, as_text(m))) or 0)
               for p in range(16) for m in cast(list[bytes], r.zrange(keys.due(p), 0, 2))]
    mean = sum(sampled) / len(sampled)
    assert parts["scheduled"].bytes == int(300 * mean) and "(measured)" in parts["scheduled"].how
    assert "no rate yet" in parts["finished"].how and parts["finished"].bytes == 0
    lengths = sum(r.xlen(keys.events(p)) for p in range(16))
    sizes = sum(int(r.memory_usage(keys.events(p)) or 0) for p in range(16))
    bound = 16 * (defaults.EVENTS_KEEP + defaults.STREAM_NODE_ENTRIES) * sizes / lengths
    assert parts["events"].bytes == int(bound)
    assert parts["total"].bytes == sum(p.bytes for k, p in parts.items() if k != "total")
    assert len(jobs) == 300

    # The overview's samples give the rate: 6,000 runs ended in 50 minutes, 2/s, kept 7 days.
    now = client.now_ms()
    for at, done in ((now - 3_000_000, 1_000), (now, 7_000)):
        client.run(op_add_sample(json.dumps({"t": at, "at": at, "succeeded": done - 200,
                                             "failed": 200}), at, 0))
    finished = _parts(client)["finished"]
    assert finished.bytes == int(2.0 * 7 * 86_400 * defaults.FINISHED_JOB_BYTES)
    assert finished.how.startswith("2.0 runs/s x 168 h")

    # An archiver reading partition 0: its stream counts at what it holds, not at the bound.
    r.xgroup_create(keys.events(0), keys.EVENTS_GROUP, id="0", mkstream=True)
    events = _parts(client)["events"]
    assert "15 streams x" in events.how and "1 read by an archiver" in events.how


def test_doctor_lists_the_projection_in_mb(client: Client, redis_url: str) -> None:
    client.schedule_many([JobSpec("t", run_at="2030-01-01T00:00:00Z") for _ in range(50)])
    rows = {c["check"]: c for c in as_json(redis_url, "doctor")}
    for part in ("scheduled", "finished", "events", "dead letters", "total"):
        assert rows[f"memory {part}"]["level"] == "ok"
    assert rows["memory scheduled"]["message"].split(" MB: ")[1].startswith("50 due x ")


def test_get_memory_answers_the_projection_doctor_lists(client: Client, redis_url: str) -> None:
    client.schedule_many([JobSpec("t", run_at="2030-01-01T00:00:00Z") for _ in range(20)])
    with TestClient(create_app(settings(redis_url), auth=False)) as api:
        res = api.get("/memory")
    assert res.status_code == 200
    got = res.json()["parts"]
    want = _parts(client)
    assert [p["part"] for p in got] == list(want)
    assert [(p["bytes"], p["how"]) for p in got] == [(w.bytes, w.how) for w in want.values()]
