"""HTTP target jobs through the HTTP API: a bad target is a 422 naming its field and stores
nothing; a good one is kept exactly (its defaults filled in) beside the payload, and a payload
change keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.helpers import problem_of
from support.helpers import settings as _settings

from rsched.api.app import create_app
from rsched.rdb import keys

URL = "https://hooks.example.com/rsched"


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


@pytest.mark.parametrize(("target", "field"), [
    ({"url": "gopher://hooks.example.com/"}, "target.url"),
    ({"url": "https://me:secret@hooks.example.com/"}, "target.url"),
    ({"url": URL + "?" + "q" * 2048}, "target.url"),
    ({"url": URL, "method": "HEAD"}, "target.method"),
    ({"url": URL, "headers": {"Transfer-Encoding": "chunked"}}, "target.headers.Transfer-Encoding"),
    ({"url": URL, "headers": {"rsched-signature": "forged"}}, "target.headers.rsched-signature"),
    ({"url": URL, "headers": {"X-Split": "a\nb"}}, "target.headers.X-Split"),
    ({"url": URL, "headers": {"X-N": 1}}, "target.headers.X-N"),
    ({"url": URL, "timeoutSeconds": 901}, "target.timeoutSeconds"),
    ({"url": URL, "timeoutSeconds": -1}, "target.timeoutSeconds"),
    ("https://hooks.example.com", "target"),
])
def test_a_bad_target_is_a_422_naming_its_field_and_nothing_is_stored(
        api: TestClient, r: redis.Redis, target: Any, field: str) -> None:
    problem_of(api.post("/jobs", json={"type": "http", "target": target}), 422, field)
    assert not list(r.scan_iter(match=keys.job_pattern()))


def test_an_http_job_needs_its_target_and_a_target_its_type(api: TestClient) -> None:
    problem_of(api.post("/jobs", json={"type": "http", "payload": 1}), 422, "target")
    problem_of(api.post("/jobs", json={"type": "mail", "target": {"url": URL}}), 422, "type")


def test_a_target_is_kept_beside_the_payload_and_a_payload_change_keeps_it(
        api: TestClient) -> None:
    res = api.post("/jobs", json={"target": {"url": URL, "headers": {"X-Tenant": "acme"}},
                                  "payload": {"n": 1}, "runAt": "2099-01-01T00:00:00Z"})
    assert res.status_code == 201, res.text
    made = res.json()
    want = {"url": URL, "method": "POST", "headers": {"X-Tenant": "acme"}, "timeoutSeconds": 30}
    assert made["type"] == "http" and made["target"] == want and made["payload"] == {"n": 1}
    got = api.get(f"/jobs/{made['id']}").json()
    assert got["target"] == want and got["payload"] == {"n": 1}
    patched = api.patch(f"/jobs/{made['id']}", json={"payload": {"n": 2}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["target"] == want and patched.json()["payload"] == {"n": 2}
    other = api.post("/jobs", json={"type": "mail", "payload": 1}).json()
    assert other["target"] is None


def test_a_batch_takes_targets_each_item_with_its_own_error(api: TestClient) -> None:
    res = api.post("/jobs/batch", json={"jobs": [
        {"target": {"url": URL}, "payload": 1},
        {"target": {"url": "http://hooks.example.com/", "headers": {"Connection": "close"}}}]})
    assert res.status_code == 200, res.text
    ok, bad = res.json()["results"]
    assert ok["job"]["target"]["url"] == URL, ok
    assert bad["error"]["errors"][0]["field"] == "jobs[1].target.headers.Connection", bad
