"""The streams' bounds (lua/trim_streams.lua, run by the dispatcher): without an archiver an events
stream is trimmed to RSCHED_EVENTS_KEEP entries and RSCHED_EVENTS_KEEP_MS of age; with one, to
what every consumer group has read, never below; a queue stream to what workers acknowledged."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis
from support.helpers import Rig, xrange, xrevrange

from rsched.archive._streams import EventStreams
from rsched.rdb import keys

NODE = 100  # stream-node-max-entries: approximate trimming removes whole nodes of this many


def _fill(r: redis.Redis, p: int, n: int, start_ms: int = 1) -> None:
    """n single-event entries on partition p's stream, one per ms from start_ms."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(keys.events(p), {"e": "scheduled", "j": f"{p}-job{i}"}, id=f"{start_ms + i}-0")
    pipe.execute()


def _trim(redis_url: str, now_ms: int | None = None, **overrides: int) -> tuple[int, int, int]:
    """One trim round of a real dispatcher holding every partition: (trimmed, bounded, read)."""
    async def go() -> tuple[int, int, int]:
        clock = (lambda: now_ms) if now_ms is not None else None
        async with Rig(redis_url, settings_overrides=overrides, clock=clock) as rig:
            await rig.lease()
            res = await rig.dispatcher.trim_once()
            return res.trimmed, res.bounded, res.read

    return asyncio.run(go())


def test_without_an_archiver_a_stream_keeps_its_newest_entries_up_to_the_bound(
        r: redis.Redis, redis_url: str) -> None:
    _fill(r, 0, 5_000)
    _fill(r, 1, 300)
    trimmed, bounded, read = _trim(redis_url, events_keep=1_000, events_keep_ms=0)
    left = r.xlen(keys.events(0))
    assert 1_000 <= left <= 1_000 + NODE and trimmed == 5_000 - left
    assert r.xlen(keys.events(1)) == 300  # under the bound: untouched
    last = xrevrange(r, keys.events(0), count=1)[0][0]
    assert last == b"5000-0"  # the newest entries stay
    assert (bounded, read) == (16, 0)  # no partition's stream has a group


def test_without_an_archiver_entries_older_than_keep_ms_go(
        r: redis.Redis, redis_url: str) -> None:
    _fill(r, 0, 1_000, start_ms=1_000)  # entries at 1,000..1,999 ms
    _fill(r, 0, 1_000, start_ms=10_000)  # ... and at 10,000..10,999 ms
    _trim(redis_url, now_ms=15_000, events_keep=0, events_keep_ms=6_000)  # older than 9,000 go
    oldest = int(xrange(r, keys.events(0), count=1)[0][0].split(b"-")[0])
    assert r.xlen(keys.events(0)) <= 1_000 + NODE and oldest >= 2_000 - NODE
    _trim(redis_url, events_keep=0, events_keep_ms=0)  # no bound at all: nothing goes
    assert r.xlen(keys.events(0)) <= 1_000 + NODE


def test_an_archivers_group_keeps_every_entry_it_has_not_read_whatever_the_bound(
        r: redis.Redis, redis_url: str) -> None:
    _fill(r, 0, 3_000)
    r.xgroup_create(keys.events(0), keys.EVENTS_GROUP, id="0")
    assert _trim(redis_url, events_keep=100, events_keep_ms=1)[0] == 0  # read nothing yet
    assert r.xlen(keys.events(0)) == 3_000
    r.xreadgroup(keys.EVENTS_GROUP, "a1", {keys.events(0): ">"}, count=2_000)
    delivered = xrange(r, keys.events(0), count=2_000)
    r.xack(keys.events(0), keys.EVENTS_GROUP, *[sid for sid, _ in delivered[:1_500]])
    trimmed, bounded, read = _trim(redis_url, events_keep=100, events_keep_ms=1)
    oldest = int(xrange(r, keys.events(0), count=1)[0][0].split(b"-")[0])
    assert oldest <= 1_501  # the oldest pending entry (1,501 ms) and all above it stay
    assert 3_000 - 1_500 <= r.xlen(keys.events(0)) <= 3_000 - 1_500 + NODE
    assert (trimmed, bounded, read) == (3_000 - r.xlen(keys.events(0)), 15, 1)
    # A second group that has read less holds the stream back to its own read point.
    r.xgroup_create(keys.events(0), "others", id="1200-0")
    r.xack(keys.events(0), keys.EVENTS_GROUP, *[sid for sid, _ in delivered[1_500:]])
    before = r.xlen(keys.events(0))
    _trim(redis_url, events_keep=100, events_keep_ms=1)
    assert r.xlen(keys.events(0)) == before  # 'others' has not read past 1,201 ms


def test_an_archiver_registering_late_says_what_the_streams_lost_before_it(
        r: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    _fill(r, 0, 2_000)
    _trim(redis_url, events_keep=500, events_keep_ms=0)
    lost = 2_000 - r.xlen(keys.events(0))
    assert lost >= 1_400
    streams = EventStreams(redis.Redis.from_url(redis_url), 16, "a1", 100, own_pending=False)
    with caplog.at_level(logging.WARNING, "rsched.archive"):
        streams.setup()
        streams.setup()  # the group exists now: nothing more to say
    said = [m for m in caplog.messages if "not archived" in m]
    assert len(said) == 1 and f"{lost} events stream entries trimmed before it" in said[0]


def test_a_queue_streams_acknowledged_entries_go_and_its_pending_ones_stay(
        r: redis.Redis, redis_url: str) -> None:
    stream = keys.stream(0, "mail")
    r.sadd(keys.queues(0), "mail")
    r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    for i in range(1, 1_001):
        r.xadd(stream, {"r": f"run{i}"}, id=f"{i}-0")
    r.xreadgroup(keys.GROUP, "w1", {stream: ">"}, count=1_000)
    r.xack(stream, keys.GROUP, *[f"{i}-0" for i in range(1, 801)])  # 801.. still running
    _trim(redis_url)
    assert 200 <= r.xlen(stream) <= 200 + NODE
    assert len(r.xpending_range(stream, keys.GROUP, "-", "+", 1_000)) == 200
