"""Background operations (a dead-letter purge): one runner at a time under a fenced lease, a
takeover resumes where the last runner recorded its place, a cancel stops it, and the API
answers at once and lists them."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.cli import as_json, ok, run_main
from support.helpers import settings as _settings

from rsched import Client
from rsched.api.app import create_app
from rsched.core.codes import OperationStep
from rsched.core.errors import Conflict, NotFound
from rsched.rdb import keys
from rsched.rdb import operations as store
from rsched.service.apikeys import op_create_key
from rsched.service.dead_letters import DeadFilter
from rsched.service.operations import (
    op_cancel_operation,
    op_get_operation,
    op_list_operations,
    op_run,
    op_running_ids,
    op_start_purge,
)

KEEP = 60_000


def _fake_letters(r: redis.Redis, partitions: int, per_partition: int) -> int:
    """Dead-set entries without run hashes: a purge without a filter reads no run, and removes
    them (counted as scanned and matched; not as deleted dead runs)."""
    pipe = r.pipeline(transaction=False)
    for p in range(partitions):
        pipe.zadd(keys.dead(p), {f"{p}-fake{i}@1": 1_000 + i for i in range(per_partition)})
    pipe.execute()
    return partitions * per_partition


def test_a_second_runner_waits_for_the_lease_then_resumes_where_the_first_recorded_its_place(
        client: Client, r: redis.Redis) -> None:
    P = client.run(client.op_partitions())
    total = _fake_letters(r, P, 3)
    op = client.run(op_start_purge(client, DeadFilter(), True, "test"))
    assert op.total == total and client.run(op_running_ids()) == [op.id]
    # Runner A takes it with a short lease and records that it read every partition but the
    # last, then stalls.
    took = client.run(store.op_step(op.id, "A", 0, 300, "", KEEP, {}))
    assert took.code is OperationStep.HELD
    place = {"scanned": 3 * (P - 1), "matched": 3 * (P - 1), "part": P - 1}
    assert client.run(store.op_step(op.id, "A", took.fence, 300, "", KEEP, place)).code \
        is OperationStep.HELD
    assert client.run(op_run(client, op.id, "B")) is OperationStep.OTHER  # A's lease holds
    time.sleep(0.4)
    assert client.run(op_run(client, op.id, "B")) is OperationStep.HELD
    done = client.run(op_get_operation(op.id))
    assert (done.status, done.scanned, done.matched, done.total) == (
        "succeeded", total, total, total)
    assert sum(r.zcard(keys.dead(p)) for p in range(P)) == total  # a dry run deletes nothing
    # A wakes up: its fence is stale, its progress is refused and changes nothing.
    late = client.run(store.op_step(op.id, "A", took.fence, 300, "", KEEP, {"scanned": 0}))
    assert late.code is OperationStep.ENDED
    assert client.run(op_get_operation(op.id)).scanned == total
    assert client.run(op_running_ids()) == []


def test_a_stale_fence_is_refused_while_the_new_holder_runs(client: Client) -> None:
    op = client.run(op_start_purge(client, DeadFilter(), True, "test"))
    a = client.run(store.op_step(op.id, "A", 0, 1, "", KEEP, {}))
    time.sleep(0.01)
    b = client.run(store.op_step(op.id, "B", 0, 60_000, "", KEEP, {"scanned": 5}))
    assert (a.code, b.code, b.fence) == (OperationStep.HELD, OperationStep.HELD, a.fence + 1)
    stale = client.run(store.op_step(op.id, "A", a.fence, 60_000, "", KEEP, {"scanned": 99}))
    assert stale == (OperationStep.OTHER, b.fence)
    assert client.run(op_get_operation(op.id)).scanned == 5


def test_a_purge_deletes_exactly_the_matches_and_a_cancel_stops_the_next(
        client: Client, r: redis.Redis) -> None:
    P = client.run(client.op_partitions())
    total = _fake_letters(r, P, 2)
    op = client.run(op_start_purge(client, DeadFilter(), False, "test"))
    assert client.run(op_run(client, op.id, "A")) is OperationStep.HELD
    done = client.run(op_get_operation(op.id))
    assert (done.status, done.scanned, done.matched) == ("succeeded", total, total)
    assert sum(r.zcard(keys.dead(p)) for p in range(P)) == 0
    _fake_letters(r, P, 2)
    second = client.run(op_start_purge(client, DeadFilter(), False, "test"))
    cancelled = client.run(op_cancel_operation(second.id, "ann"))
    assert (cancelled.status, cancelled.cancelled_by) == ("cancelled", "ann")
    assert client.run(op_run(client, second.id, "A")) is OperationStep.ENDED
    assert sum(r.zcard(keys.dead(p)) for p in range(P)) == total  # nothing deleted
    with pytest.raises(Conflict, match="cancelled already"):
        client.run(op_cancel_operation(second.id, "ann"))
    with pytest.raises(NotFound):
        client.run(op_get_operation("P84vNiH15DGCv93OmE9"))
    assert r.pttl(keys.operation(second.id)) > 0  # an ended operation expires


def test_operations_are_listed_newest_first_each_once_across_pages(client: Client) -> None:
    made = [client.run(op_start_purge(client, DeadFilter(), True, "test")).id for _ in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        ops, cursor = client.run(op_list_operations(3, cursor))
        seen += [o.id for o in ops]
        if cursor is None:
            break
    assert seen == sorted(made, reverse=True)  # ids sort by creation ms: newest first


def test_the_api_answers_202_and_a_read_key_follows_but_cannot_cancel(
        client: Client, redis_url: str, r: redis.Redis) -> None:
    P = client.run(client.op_partitions())
    _fake_letters(r, P, 1)
    _, admin = client.run(op_create_key("ops", "admin"))
    _, reader = client.run(op_create_key("viewer", "read"))
    with TestClient(create_app(_settings(redis_url), key_cache_s=0)) as api:
        api.headers["Authorization"] = f"Bearer {admin}"
        res = api.post("/dead-letters/purge", json={"dryRun": True})
        assert res.status_code == 202
        op: dict[str, Any] = res.json()
        deadline = time.monotonic() + 30
        while op["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
            op = api.get(f"/operations/{op['id']}").json()
        assert (op["status"], op["matched"], op["total"], op["who"]) == (
            "succeeded", P, P, f"ops ({op['who'].split('(')[1]}")
        listed = api.get("/operations").json()
        assert [o["id"] for o in listed["operations"]] == [op["id"]]
        assert listed["nextCursor"] is None
        conflict = api.post(f"/operations/{op['id']}/cancel")
        assert conflict.status_code == 409
        assert api.get("/operations/nope").status_code == 404
        read = {"Authorization": f"Bearer {reader}"}
        assert api.get(f"/operations/{op['id']}", headers=read).status_code == 200
        assert api.post(f"/operations/{op['id']}/cancel", headers=read).status_code == 403


def test_the_cli_lists_shows_and_cancels_operations(client: Client, redis_url: str) -> None:
    waiting = client.run(op_start_purge(client, DeadFilter(type="boom"), False, "test"))
    listed = ok(redis_url, "operations", "list")
    assert waiting.id in listed and "running" in listed
    assert "filter: {'type': 'boom'}" in ok(redis_url, "operations", "show", waiting.id)
    cancelled = as_json(redis_url, "operations", "cancel", waiting.id)
    assert (cancelled["status"], cancelled["cancelledBy"]) == ("cancelled", "cli")
    again = run_main(redis_url, "operations", "cancel", waiting.id)
    assert again.returncode != 0 and "cancelled already" in again.stderr
    assert "Traceback" not in again.stderr
    missing = run_main(redis_url, "operations", "show", "nope")
    assert missing.returncode != 0 and "not found" in missing.stderr
    page = as_json(redis_url, "operations", "list", "--limit", "1")
    assert [o["id"] for o in page["operations"]] == [waiting.id]
    last = as_json(redis_url, "operations", "list", "--limit", "1", "--cursor", page["nextCursor"])
    assert last == {"operations": [], "nextCursor": None}
