"""The faces of limits against the real session redis-server: PUT/GET/DELETE /limits/{name} and
GET /limits (paged), their 422s (each naming the field, nothing stored) and scopes, a job's
limitKey in the API, and `rsched limits` / `rsched jobs add --limit-key` in the CLI."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from support.cli import as_json, ok, rsched, run_main
from support.helpers import problem_of
from support.helpers import settings as _settings

from rsched import AsyncClient, Client
from rsched.api.app import create_app
from rsched.core.errors import NotFound, ValidationError
from rsched.core.ids import partition_for_key
from rsched.core.limits import Limit
from rsched.rdb import keys
from rsched.service.apikeys import op_create_key


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


def test_put_get_list_and_delete_a_limit(api: TestClient, r: redis.Redis) -> None:
    body = {"concurrency": 2, "rate": {"limit": 600, "periodSeconds": 60}}
    res = api.put("/limits/tenant-*", json=body)
    assert res.status_code == 200, res.text
    assert res.json() == {"name": "tenant-*", **body}
    # A family: no counts of its own, its busiest keys (none busy yet).
    assert api.get("/limits/tenant-*").json() == {"name": "tenant-*", **body, "busiestKeys": []}
    assert api.put("/limits/acme", json={"concurrency": 1}).status_code == 200
    got = api.get("/limits/acme").json()
    assert got == {"name": "acme", "concurrency": 1, "rate": None, "inFlight": 0, "waiting": 0,
                   "busiestKeys": []}
    # Every partition holds the family; only acme's holds acme's own definition.
    p = partition_for_key("acme", 16)
    assert r.hget(keys.limits(p), "acme") == b"1 0 0"
    assert all(r.hget(keys.limits(q), "tenant-*") == b"2 600 60000" for q in range(16))
    assert sum(r.hexists(keys.limits(q), "acme") for q in range(16)) == 1
    names = [x["name"] for x in api.get("/limits").json()["limits"]]
    assert names == ["acme", "tenant-*"]
    listed = api.get("/limits", params={"busiest": 3}).json()["limits"]
    assert [x["busiestKeys"] for x in listed] == [[], []]
    for bad in ("-1", "101", "x"):
        problem_of(api.get("/limits", params={"busiest": bad}), 422, "busiest")
    res = api.delete("/limits/acme")
    assert res.status_code == 204 and res.content == b""
    problem_of(api.get("/limits/acme"), 404)
    problem_of(api.delete("/limits/acme"), 404)
    assert not r.hexists(keys.limits(p), "acme")


def test_get_limits_pages_by_name(api: TestClient) -> None:
    for k in range(5):
        assert api.put(f"/limits/k{k}", json={"concurrency": k + 1}).status_code == 200
    first = api.get("/limits", params={"limit": 2}).json()
    assert [x["name"] for x in first["limits"]] == ["k0", "k1"] and first["nextCursor"]
    seen = [x["name"] for x in first["limits"]]
    cursor = first["nextCursor"]
    while cursor:
        page = api.get("/limits", params={"limit": 2, "cursor": cursor}).json()
        seen += [x["name"] for x in page["limits"]]
        cursor = page["nextCursor"]
    assert seen == [f"k{k}" for k in range(5)]
    problem_of(api.get("/limits", params={"cursor": "nope"}), 422, "cursor")
    problem_of(api.get("/limits", params={"limit": 0}), 422, "limit")


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("k", {"concurrency": 0}, "concurrency"),
        ("k", {"concurrency": 1_000_001}, "concurrency"),
        ("k", {"rate": {"limit": 0, "periodSeconds": 1}}, "rate.limit"),
        ("k", {"rate": {"limit": 1, "periodSeconds": 0}}, "rate.periodSeconds"),
        ("k", {"rate": {"limit": 1, "periodSeconds": 86_401}}, "rate.periodSeconds"),
        ("k", {}, "concurrency"),
        ("k", {"concurrency": 1, "extra": 1}, "extra"),
        ("a*b", {"concurrency": 1}, "name"),
        ("x" * 201, {"concurrency": 1}, "name"),
        ("a%09b", {"concurrency": 1}, "name"),
    ],
)
def test_a_bad_limit_is_a_422_naming_the_field_and_nothing_is_stored(
    api: TestClient, r: redis.Redis, name: str, body: dict[str, Any], field: str
) -> None:
    problem_of(api.put(f"/limits/{name}", json=body), 422, field)
    assert r.hlen(keys.limits_index()) == 0
    assert not any(r.exists(keys.limits(p)) for p in range(16))


def test_a_jobs_limit_key_goes_in_and_out_of_the_api_and_a_bad_one_is_a_422(
    api: TestClient
) -> None:
    res = api.post("/jobs", json={"type": "t", "limitKey": "tenant-7"})
    assert res.status_code == 201, res.text
    job = res.json()
    assert job["limitKey"] == "tenant-7"
    assert job["id"].startswith(f"{partition_for_key('tenant-7', 16)}-")
    assert api.get(f"/jobs/{job['id']}").json()["limitKey"] == "tenant-7"
    problem_of(api.post("/jobs", json={"type": "t", "limitKey": "a*"}), 422, "limitKey")
    problem_of(api.post("/jobs", json={"type": "t", "limitKey": ""}), 422, "limitKey")
    batch = api.post("/jobs/batch", json={"jobs": [{"type": "t", "limitKey": "b"},
                                                   {"type": "t", "limitKey": 5}]}).json()
    assert batch["results"][0]["job"]["limitKey"] == "b"
    assert batch["results"][1]["error"]["errors"][0]["field"] == "jobs[1].limitKey"
    assert api.patch(f"/jobs/{job['id']}", json={"priority": 3}).json()["limitKey"] == "tenant-7"


def test_setting_a_limit_needs_the_write_scope(redis_url: str) -> None:
    c = Client(settings=_settings(redis_url))
    secrets = {scope: c.run(op_create_key(f"{scope} key", scope))[1]
               for scope in ("read", "write")}
    c.close()
    with TestClient(create_app(_settings(redis_url), key_cache_s=0)) as api:
        read = {"Authorization": f"Bearer {secrets['read']}"}
        write = {"Authorization": f"Bearer {secrets['write']}"}
        problem_of(api.put("/limits/k", json={"concurrency": 1}, headers=read), 403)
        assert api.put("/limits/k", json={"concurrency": 1}, headers=write).status_code == 200
        assert api.get("/limits/k", headers=read).status_code == 200
        problem_of(api.delete("/limits/k", headers=read), 403)
        assert api.delete("/limits/k", headers=write).status_code == 204


def test_the_python_clients_set_get_list_and_delete(client: Client, redis_url: str) -> None:
    assert client.set_limit("api", rate=(10, 1)) == Limit("api", None, 10, 1000)
    view = client.get_limit("api")
    assert (view.limit.rate_limit, view.in_flight, view.waiting) == (10, 0, 0)
    with pytest.raises(ValidationError) as caught:
        client.set_limit("api", concurrency=0)
    assert caught.value.field == "concurrency"

    async def run() -> None:
        ac = AsyncClient(settings=_settings(redis_url))
        try:
            await ac.set_limit("t-*", concurrency=3)
            assert [x.name for x in await ac.list_limits()] == ["api", "t-*"]
            assert (await ac.get_limit("t-*")).in_flight is None  # a family
            await ac.delete_limit("t-*")
        finally:
            await ac.close()

    asyncio.run(run())
    assert [x.name for x in client.list_limits()] == ["api"]
    client.delete_limit("api")
    with pytest.raises(NotFound):
        client.get_limit("api")


def test_the_cli_sets_lists_shows_and_deletes_limits(redis_url: str) -> None:
    got = as_json(redis_url, "limits", "set", "tenant-*", "--concurrency", "2", "--rate", "600/60s")
    assert got == {"name": "tenant-*", "concurrency": 2,
                   "rate": {"limit": 600, "periodSeconds": 60}}
    assert "tenant-*" in ok(redis_url, "limits", "list")
    assert as_json(redis_url, "limits", "show", "tenant-*")["concurrency"] == 2
    job = as_json(redis_url, "jobs", "add", "--type", "t", "--limit-key", "tenant-1")
    assert job["limitKey"] == "tenant-1"
    for args, flag in ((["limits", "set", "x", "--rate", "10/1d"], "--rate"),
                       (["limits", "set", "x", "--concurrency", "0"], "--concurrency"),
                       (["limits", "set", "x*y", "--concurrency", "1"], "NAME"),
                       (["jobs", "add", "--type", "t", "--limit-key", "a*"], "--limit-key")):
        with pytest.raises(ValidationError) as caught:
            rsched(redis_url, *args)
        assert caught.value.field == flag
    shown = run_main(redis_url, "limits", "set", "x", "--rate", "10/1d")  # as a shell sees it
    assert shown.returncode != 0 and "--rate" in shown.stderr and "Traceback" not in shown.stderr
    assert "deleted" in ok(redis_url, "limits", "delete", "tenant-*")
    assert as_json(redis_url, "limits", "list") == []
