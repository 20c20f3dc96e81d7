"""Values are kept as given or refused naming the field, never silently changed: integers past 64
bits in a payload, and handler results that are no JSON (issue 15, item 4)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from starlette.testclient import TestClient
from support.helpers import Rig
from support.helpers import settings as _settings

from rsched import App, Client, JobContext, ValidationError
from rsched.api.app import create_app
from rsched.api.problems import classify, dumps
from rsched.core.defaults import VALUE_DEPTH
from rsched.core.spec import INT_RANGE
from rsched.core.values import shallow_json, shallow_msgpack, too_deep
from rsched.engine.worker.runner import MAX_RESULT_BYTES

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

    @app.job("deep")
    def deep(ctx: JobContext) -> Any:
        return _nested(VALUE_DEPTH + 1)

    @app.job("deeper")
    async def deeper(ctx: JobContext) -> Any:
        return {"a": _nested(5000)}  # past Python's recursion limit

    @app.job("at-limit")
    def at_limit(ctx: JobContext) -> Any:
        return _nested(VALUE_DEPTH)

    @app.job("huge")
    def huge(ctx: JobContext) -> Any:
        return "x" * MAX_RESULT_BYTES  # its JSON has two quotes more: over the limit

    @app.job("huger")
    async def huger(ctx: JobContext) -> Any:
        return {"rows": ["y" * 1000] * 100}

    @app.job("full")
    def full(ctx: JobContext) -> Any:
        return "x" * (MAX_RESULT_BYTES - 2)  # exactly the limit as JSON

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


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("refused", "error", "kept", "result"), [
    (("opaque", "nan"), "the result could not be serialized", "big",
     {"n": 2**70}),  # JSON has no integer limit
    (("deep", "deeper"), f"the result is nested more than {VALUE_DEPTH} levels deep",
     "at-limit", _nested(VALUE_DEPTH)),
    (("huge", "huger"), f"over the limit of {MAX_RESULT_BYTES:,} bytes", "full",
     "x" * (MAX_RESULT_BYTES - 2)),
], ids=["no JSON", "too deep", "too big"])
def test_a_result_that_is_no_json_too_deep_or_too_big_fails_the_attempt_saying_so(
    api: TestClient, redis_url: str, refused: tuple[str, str], error: str, kept: str,
    result: Any,
) -> None:
    ids = {t: api.post("/jobs", json={"type": t, "maxAttempts": 1}).json()["id"]
           for t in (*refused, kept)}
    _run_due(redis_url, 3)
    for t in refused:
        run = api.get(f"/jobs/{ids[t]}/runs").json()["runs"][0]
        assert run["status"] == "failed", run
        assert error in run["error"], run
        assert run["result"] is None and "object at 0x" not in run["error"]
    assert api.get("/jobs").status_code == 200
    run = api.get(f"/jobs/{ids[kept]}/runs").json()["runs"][0]
    assert run["status"] == "succeeded" and run["result"] == result


def _nested_tuple(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = (value,)
    return value


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in [*value, *value.values()]), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize("value", [
    1, "x" * 500, [], {}, _nested(VALUE_DEPTH), _nested(VALUE_DEPTH + 1),
    {"rows": [{"id": i, "tags": ["a", {"b": _nested(i)}]} for i in range(70)]},
    {(1, (2, (3,))): "tuple keys"}, {"k": {"k": {_nested_tuple(VALUE_DEPTH - 1): 1}}},
    [[{"é" * 40: [b"\x80\x9f\xdc" * 30]}] * 3] * 3,
])
def test_the_depth_check_agrees_with_counting_the_levels(value: Any) -> None:
    deep = _depth(value) > VALUE_DEPTH
    assert too_deep(value) is deep
    packed = msgpack.packb(value, use_bin_type=True)
    assert not (deep and shallow_msgpack(packed)), "the cheap bound let a deep value through"
    try:
        text = json.dumps(value, default=lambda b: b.hex())
    except TypeError:  # tuple keys: no JSON
        return
    assert not (deep and shallow_json(text))


def test_a_patch_with_a_big_integer_is_refused_naming_its_path(api: TestClient) -> None:
    job = api.post("/jobs", json={"type": "t", "runAt": "2030-01-01T00:00:00Z"}).json()
    res = api.patch(f"/jobs/{job['id']}", content=b'{"payload": {"n": 99999999999999999999}}',
                    headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text
    assert res.json()["errors"][0]["field"] == "payload.n"
    assert api.get(f"/jobs/{job['id']}").json()["payload"] is None  # unchanged


def test_an_answer_nested_past_the_encoders_limit_still_encodes_with_a_placeholder() -> None:
    out = json.loads(dumps({"deep": _nested(5000), "bytes": b"\x00", "ok": _nested(3)}))
    assert out["ok"] == _nested(3) and out["bytes"] == "AA=="
    inner = out["deep"]
    for _ in range(2 * VALUE_DEPTH - 1):
        inner = inner[0]
    assert inner == {"$unreadable": f"nested more than {VALUE_DEPTH} levels deep (arrays and "
                                     "objects)"}


def test_a_recursion_error_is_logged_in_one_line_without_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def recurse(n: int) -> int:
        return recurse(n + 1) + 1

    try:
        recurse(0)
    except RecursionError as e:
        error = e
    with caplog.at_level("ERROR", logger="rsched.api"):
        assert classify(error)["status"] == 500
    (record,) = caplog.records
    assert record.exc_info is None and "RecursionError" in record.getMessage()
    assert "\n" not in caplog.text.strip()
