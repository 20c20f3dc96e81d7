"""Values are kept as given or refused naming the field, never silently changed: integers past 64
bits in a payload, and handler results that are no JSON (issue 15, item 4)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import Rig
from helpers import settings as _settings
from starlette.testclient import TestClient

from rsched import App, Client, JobContext, ValidationError
from rsched.api.app import create_app
from rsched.core.spec import INT_RANGE

LO, HI = INT_RANGE


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


def _post_raw(api: TestClient, path: str, text: str) -> Any:
    return api.post(path, content=text.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("number", [str(HI + 1), str(LO - 1), "1" + "0" * 40])
def test_an_integer_beyond_64_bits_is_a_422_naming_its_path_in_the_payload(
    api: TestClient, number: str
) -> None:
    text = '{"type": "t", "payload": {"items": [1, {"n": N}]}}'.replace("N", number)
    res = _post_raw(api, "/jobs", text)
    assert res.status_code == 422, res.text
    body = res.json()
    assert body["errors"][0]["field"] == "payload.items[1].n"
    assert "64 bits" in body["errors"][0]["reason"]


@pytest.mark.parametrize("number", [HI, LO, 2**63, 12345678901234567890])
def test_an_integer_at_the_64_bit_limits_comes_back_exactly(api: TestClient, number: int) -> None:
    res = _post_raw(api, "/jobs", '{"type": "t", "payload": {"n": N}}'.replace("N", str(number)))
    assert res.status_code == 201, res.text
    # json keeps every integer exactly (a float would come back as 1.2e19 and differ)
    got = json.loads(api.get(f"/jobs/{res.json()['id']}").text)["payload"]["n"]
    assert type(got) is int and got == number


def test_a_batch_refuses_only_the_job_with_the_big_integer(api: TestClient) -> None:
    text = ('{"jobs": [{"type": "t", "payload": 1}, {"type": "t", "payload": [N]}]}'
            .replace("N", str(HI + 1)))
    results = _post_raw(api, "/jobs/batch", text).json()["results"]
    assert results[0]["status"] == 201
    assert results[1]["status"] == 422
    assert results[1]["error"]["errors"][0]["field"] == "jobs[1].payload[0]"


def test_digits_inside_strings_are_left_alone(api: TestClient) -> None:
    digits = "1" * 30
    text = '{"type": "t", "payload": {"s": "D", "f": 1.5}}'.replace("D", digits)
    res = _post_raw(api, "/jobs", text)
    assert res.status_code == 201, res.text
    assert res.json()["payload"] == {"s": digits, "f": 1.5}


def test_python_callers_get_the_same_error_naming_the_path(client: Client) -> None:
    with pytest.raises(ValidationError) as e:
        client.schedule("t", {"a": {"b": -(2**70)}})
    assert e.value.field == "payload.a.b"


class _Opaque:
    pass


def _app() -> App:
    app = App("values")

    @app.job("opaque")
    def opaque(ctx: JobContext) -> Any:
        return {"value": _Opaque()}

    @app.job("nan")
    async def nan(ctx: JobContext) -> Any:
        return float("nan")

    @app.job("big")
    def big(ctx: JobContext) -> Any:
        return {"n": 2**70}

    return app


def _run_due(redis_url: str, runs: int) -> None:
    async def go() -> None:
        async with Rig(redis_url, _app()) as rig:
            done = 0
            for _ in range(20):  # a fetch takes one entry per stream: jobs may share one
                done += (await rig.cycle())[2]
                if done >= runs:
                    break

    asyncio.run(go())


def test_a_result_that_is_no_json_fails_the_attempt_saying_so(
    api: TestClient, redis_url: str
) -> None:
    ids = {t: api.post("/jobs", json={"type": t, "maxAttempts": 1}).json()["id"]
           for t in ("opaque", "nan", "big")}
    _run_due(redis_url, 3)
    for t in ("opaque", "nan"):
        run = api.get(f"/jobs/{ids[t]}/runs").json()["runs"][0]
        assert run["status"] == "failed", run
        assert "the result could not be serialized" in run["error"], run
        assert run["result"] is None and "object at 0x" not in run["error"]
    run = api.get(f"/jobs/{ids['big']}/runs").json()["runs"][0]  # JSON has no integer limit
    assert run["status"] == "succeeded" and run["result"] == {"n": 2**70}


def test_a_patch_with_a_big_integer_is_refused_naming_its_path(api: TestClient) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": "2030-01-01T00:00:00Z"}).json()
    res = api.patch(f"/jobs/{job['id']}", content=b'{"payload": {"n": 99999999999999999999}}',
                    headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text
    assert res.json()["errors"][0]["field"] == "payload.n"
    assert api.get(f"/jobs/{job['id']}").json()["payload"] is None  # unchanged
