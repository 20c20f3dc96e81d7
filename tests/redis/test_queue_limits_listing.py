"""Queue-wide limits made visible against a real Redis: every queue's limit listed with its
permits held and runs waiting (GET /queues/limits, `rsched limits list`, the clients) and
exported per queue name on /metrics, read from each queue's own slot without a SCAN."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from support.cli import as_json, ok
from support.helpers import settings as _settings

from rsched import AsyncClient, Client
from rsched.api.app import create_app
from rsched.obs import metrics
from rsched.rdb.queue_limits import TAKE, PermitOp, op_permit
from rsched.service.status import op_cluster

TTL_MS = 60_000  # permits taken here outlive the test


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as c:
        yield c


def take(client: Client, queue: str, n: int) -> list[int]:
    """``n`` takes of ``queue``'s permits by worker w1, now: 0 granted, else the wait in ms."""
    now = client.now_ms()
    ops = [PermitOp(TAKE, f"j{i}@{now + i}", "w1", i % 4) for i in range(n)]
    return client.run(op_permit(queue, ops, TTL_MS)).results


def queue_metrics(client: Client) -> dict[tuple[str, str], float]:
    """(sample name, queue) -> value of the queue-limit series /metrics shows."""
    text = metrics.render(client.run(op_cluster(client))).decode()
    return {(s.name, s.labels["queue"]): s.value for fam in text_string_to_metric_families(text)
            if fam.name.startswith("rsched_queue_limit_") for s in fam.samples}


def test_every_queue_limit_is_listed_by_queue_with_its_permits_held_and_runs_waiting(
    api: TestClient, client: Client, redis_url: str
) -> None:
    assert api.get("/queues/limits").json() == {"queueLimits": []}
    assert client.list_queue_limits() == []
    client.set_queue_limit("emails", concurrency=1)
    client.set_queue_limit("bulk", rate=(5, 60))
    client.set_limit("tenant-*", concurrency=2)  # a key's limit: not a queue's
    emails = take(client, "emails", 3)
    assert emails[0] == 0 and all(w > 0 for w in emails[1:])  # one runs, two wait
    assert take(client, "bulk", 2) == [0, 0]  # the rate's permits are held while they run
    expected = [
        {"queue": "bulk", "concurrency": None, "rate": {"limit": 5, "periodSeconds": 60},
         "inFlight": 2, "waiting": 0},
        {"queue": "emails", "concurrency": 1, "rate": None, "inFlight": 1, "waiting": 2}]
    assert api.get("/queues/limits").json() == {"queueLimits": expected}
    # One queue's GET agrees with the listing.
    assert api.get("/queues/emails/limits").json() == expected[1]
    views = client.list_queue_limits()
    assert [(v.limit.name, v.in_flight, v.waiting) for v in views] == [("bulk", 2, 0),
                                                                       ("emails", 1, 2)]

    async def alist() -> list[tuple[str, int | None, int | None]]:
        ac = AsyncClient(settings=_settings(redis_url))
        try:
            return [(v.limit.name, v.in_flight, v.waiting) for v in await ac.list_queue_limits()]
        finally:
            await ac.close()

    assert asyncio.run(alist()) == [("bulk", 2, 0), ("emails", 1, 2)]
    # The CLI lists the key definitions, then the queues' limits with their counts.
    assert as_json(redis_url, "limits", "list") == {
        "limits": [{"name": "tenant-*", "concurrency": 2, "rate": None}],
        "queueLimits": expected}
    text = ok(redis_url, "limits", "list")
    assert text.index("tenant-*") < text.index("queue limits")
    rows = text.split("queue limits\n")[1].splitlines()
    assert rows[0].split() == ["QUEUE", "CONCURRENCY", "RATE", "IN", "FLIGHT", "WAITING"]
    assert [r.split() for r in rows[1:]] == [["bulk", "-", "5/60s", "2", "0"],
                                            ["emails", "1", "-", "1", "2"]]
    # A deleted queue limit is listed no more; its waiting runs are woken to start.
    assert api.delete("/queues/emails/limits").status_code == 204
    assert [q["queue"] for q in api.get("/queues/limits").json()["queueLimits"]] == ["bulk"]


def test_metrics_show_each_limited_queues_in_flight_and_waiting_by_queue_name(
    client: Client
) -> None:
    assert queue_metrics(client) == {}
    client.set_queue_limit("emails", concurrency=2)
    assert take(client, "emails", 5)[:2] == [0, 0]
    client.set_limit("acme", concurrency=1)  # key limits keep their own series
    assert queue_metrics(client) == {("rsched_queue_limit_in_flight", "emails"): 2,
                                     ("rsched_queue_limit_waiting", "emails"): 3}
    client.set_queue_limit("reports", concurrency=1)
    got = queue_metrics(client)
    assert got[("rsched_queue_limit_in_flight", "reports")] == 0
    assert got[("rsched_queue_limit_waiting", "reports")] == 0
    client.delete_queue_limit("reports")
    assert ("rsched_queue_limit_in_flight", "reports") not in queue_metrics(client)


def test_listing_queue_limits_reads_each_queues_slot_and_never_scans_the_keyspace(
    api: TestClient, client: Client, r: redis.Redis
) -> None:
    queues = [f"q{i}" for i in range(20)]
    for q in queues:
        client.set_queue_limit(q, concurrency=3)
    r.config_resetstat()
    listed = api.get("/queues/limits").json()["queueLimits"]
    assert [q["queue"] for q in listed] == sorted(queues)
    stats = r.info("commandstats")
    assert not {"cmdstat_scan", "cmdstat_keys"} & set(stats)
    # The index once, then two reads on each queue's slot (and at most Redis's clock).
    assert stats["cmdstat_hgetall"]["calls"] == 1
    assert stats["cmdstat_zcount"]["calls"] == stats["cmdstat_zcard"]["calls"] == len(queues)
