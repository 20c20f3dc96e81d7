"""Small API fixes from a day of operations (issue 15, item 10, and issue 12's key-name
pattern), against the real app and the real session redis-server."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from helpers import settings as _settings
from starlette.testclient import TestClient

from rsched.api.app import create_app


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(redis_url), auth=False)) as client:
        yield client


@pytest.mark.parametrize("name", ["ci", "deploy bot", "a@b.c:d-e_f", "x" * 64, "", "x" * 65,
                                  "no/slash", "tab\there", "line\n"])
def test_the_documented_key_name_pattern_is_the_one_the_api_enforces(
    api: TestClient, name: str
) -> None:
    pattern = api.get("/openapi.json").json()["components"]["schemas"]["ApiKeyCreate"][
        "properties"]["name"]["pattern"]
    # JSON Schema's pattern is an ECMA-262 search, whose $ (unlike Python's) is the very end
    documented = re.search(pattern.removesuffix("$") + r"\Z", name) is not None
    res = api.post("/api-keys", json={"name": name, "scope": "read"})
    assert res.status_code == (201 if documented else 422), (name, res.text)
    if not documented:
        assert res.json()["errors"][0]["field"] == "name"
