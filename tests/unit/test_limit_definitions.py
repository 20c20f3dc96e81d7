"""Limit definitions: what a PUT body may hold (each refusal names its field), the family rule
that picks a key's definition, and the CLI's rate text."""

from __future__ import annotations

from typing import Any

import pytest

from rsched.core.errors import ValidationError
from rsched.core.limits import (
    Limit,
    body_of,
    check_key,
    families,
    limit_of,
    rate_of_text,
    resolve,
)


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("k", {"concurrency": 0}, "concurrency"),
        ("k", {"concurrency": 1_000_001}, "concurrency"),
        ("k", {"concurrency": 1.5}, "concurrency"),
        ("k", {"concurrency": True}, "concurrency"),
        ("k", {"concurrency": "2"}, "concurrency"),
        ("k", {"rate": {"limit": 0, "periodSeconds": 1}}, "rate.limit"),
        ("k", {"rate": {"limit": 1, "periodSeconds": 0}}, "rate.periodSeconds"),
        ("k", {"rate": {"limit": 1, "periodSeconds": -1}}, "rate.periodSeconds"),
        ("k", {"rate": {"limit": 1, "periodSeconds": 86_400.5}}, "rate.periodSeconds"),
        ("k", {"rate": {"limit": 1}}, "rate.periodSeconds"),
        ("k", {"rate": {"limit": 1, "periodSeconds": 1, "burst": 2}}, "rate.burst"),
        ("k", {"rate": 5}, "rate"),
        ("k", {}, "concurrency"),
        ("k", {"concurrency": None, "rate": None}, "concurrency"),
        ("k", {"concurency": 2}, "concurency"),
        ("k", [1], "body"),
        ("", {"concurrency": 1}, "name"),
        ("x" * 201, {"concurrency": 1}, "name"),
        ("a\nb", {"concurrency": 1}, "name"),
        ("a\x7fb", {"concurrency": 1}, "name"),
        ("a*b", {"concurrency": 1}, "name"),
        ("**", {"concurrency": 1}, "name"),
        ("a/b", {"concurrency": 1}, "name"),
        (7, {"concurrency": 1}, "name"),
    ],
)
def test_a_bad_definition_is_refused_naming_its_field(name: Any, body: Any, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        limit_of(name, body)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("name", "body", "expected"),
    [
        ("k", {"concurrency": 1}, Limit("k", 1, None, None)),
        ("k", {"concurrency": 1_000_000}, Limit("k", 1_000_000, None, None)),
        ("t-*", {"rate": {"limit": 10, "periodSeconds": 1}}, Limit("t-*", None, 10, 1000)),
        ("*", {"concurrency": 3, "rate": {"limit": 600, "periodSeconds": 60}},
         Limit("*", 3, 600, 60_000)),
        ("k", {"rate": {"limit": 1, "periodSeconds": 0.25}}, Limit("k", None, 1, 250)),
        ("k", {"rate": {"limit": 1, "periodSeconds": 86_400}}, Limit("k", None, 1, 86_400_000)),
        ("x" * 200, {"concurrency": 1}, Limit("x" * 200, 1, None, None)),
    ],
)
def test_a_good_definition_is_kept_exactly(name: str, body: Any, expected: Limit) -> None:
    limit = limit_of(name, body)
    assert limit == expected
    assert Limit.unpacked(name, limit.packed()) == limit
    back = body_of(limit)
    assert limit_of(name, {k: v for k, v in back.items() if k != "name"}) == limit


@pytest.mark.parametrize("key", ["", "a*", "*", "x" * 201, "a\tb", "\x85", "a/b"])
def test_a_job_limit_key_is_refused_naming_limit_key(key: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_key(key)
    assert caught.value.field == "limitKey"


NAMES = ["tenant-*", "tenant-vip-*", "tenant-42", "*", "api"]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("tenant-42", "tenant-42"),  # its own definition first
        ("tenant-7", "tenant-*"),
        ("tenant-vip-1", "tenant-vip-*"),  # the longest prefix wins
        ("tenant-", "tenant-*"),  # the empty rest matches too
        ("api", "api"),
        ("apis", "*"),
        ("other", "*"),
    ],
)
def test_a_key_takes_its_own_definition_else_the_longest_family_prefix(
    key: str, expected: str
) -> None:
    assert resolve(key, NAMES) == expected


def test_a_key_with_no_definition_and_no_family_runs_unlimited() -> None:
    assert resolve("other", ["tenant-*", "api"]) is None
    assert families(NAMES) == ["tenant-vip-*", "tenant-*", "*"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10/1s", (10, 1)), ("600/60s", (600, 60)), ("5/1m", (5, 60)), ("3/500ms", (3, 0.5)),
     ("7/2", (7, 2)), ("1/1h", (1, 3600))],
)
def test_the_cli_rate_text(text: str, expected: tuple[int, float]) -> None:
    assert rate_of_text(text) == expected


@pytest.mark.parametrize("text", ["10", "10/", "/1s", "10/1d", "ten/1s", "10/-1s"])
def test_bad_rate_text_names_the_flag(text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        rate_of_text(text)
    assert caught.value.field == "--rate"
