"""Dedup windows as the faces take them: the API's JSON and the Python Dedup, each bad value
refused naming its field (no Redis: nothing can be stored before these checks pass)."""

from __future__ import annotations

from typing import Any

import pytest

from rsched.core.errors import ValidationError
from rsched.core.ids import dedup_partition, keyed_job_id, partition_for_key
from rsched.core.models import partition_of
from rsched.core.spec import MAX_DEDUP_TTL_MS, Dedup, JobSpec, check_dedup, prepare
from rsched.rdb import keys
from rsched.service.inputs import spec_from_json

NOW = 1_700_000_000_000
DAY_S = 86_400


def _field(body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as e:
        check_dedup(spec_from_json({"type": "t", **body}))
    return e.value.field


@pytest.mark.parametrize(("dedup", "field"), [
    ({"key": "", "ttlSeconds": 5}, "dedup.key"),
    ({"key": "k" * 201, "ttlSeconds": 5}, "dedup.key"),
    ({"key": "a\nb", "ttlSeconds": 5}, "dedup.key"),
    ({"key": "a\x00b", "ttlSeconds": 5}, "dedup.key"),
    ({"key": "a\u202eb", "ttlSeconds": 5}, "dedup.key"),  # a bidirectional override
    ({"key": 5, "ttlSeconds": 5}, "dedup.key"),
    ({"ttlSeconds": 5}, "dedup.key"),
    ({"key": "k", "ttlSeconds": 0}, "dedup.ttlSeconds"),
    ({"key": "k", "ttlSeconds": -1}, "dedup.ttlSeconds"),
    ({"key": "k", "ttlSeconds": 30 * DAY_S + 1}, "dedup.ttlSeconds"),
    ({"key": "k", "ttlSeconds": "5"}, "dedup.ttlSeconds"),
    ({"key": "k", "ttlSeconds": True}, "dedup.ttlSeconds"),
    ({"key": "k"}, "dedup.ttlSeconds"),
    ({"key": "k", "ttlSeconds": 5, "mode": "forever"}, "dedup.mode"),
    ({"key": "k", "ttlSeconds": 5, "mode": "TTL"}, "dedup.mode"),
    ({"key": "k", "ttlSeconds": 5, "mode": 1}, "dedup.mode"),
    ({"key": "k", "ttlSeconds": 5, "window": 1}, "dedup.window"),
])
def test_a_bad_dedup_window_is_refused_naming_its_field(dedup: dict[str, Any], field: str
                                                        ) -> None:
    assert _field({"dedup": dedup}) == field


def test_dedup_must_be_an_object() -> None:
    assert _field({"dedup": "k"}) == "dedup"
    assert _field({"dedup": ["k", 5]}) == "dedup"


@pytest.mark.parametrize(("body", "field"), [
    ({"runAt": "2030-01-01T00:00:00Z"}, "runAt"),
    ({"cron": "* * * * *"}, "cron"),
    ({"paused": True}, "paused"),
])
def test_debounce_refuses_a_run_at_a_cron_and_paused_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    assert _field({"dedup": {"key": "k", "ttlSeconds": 5, "mode": "debounce"}, **body}) == field


@pytest.mark.parametrize(("ttl_s", "ms"), [(0.001, 1), (1.5, 1500), (30 * DAY_S, MAX_DEDUP_TTL_MS)])
def test_the_bounds_of_ttl_seconds_are_kept_exactly_in_ms(ttl_s: float, ms: int) -> None:
    spec = spec_from_json({"type": "t", "dedup": {"key": "k", "ttlSeconds": ttl_s}})
    assert check_dedup(spec) == Dedup("k", ms, "ttl")


def test_the_python_dedup_is_checked_the_same_way() -> None:
    fractional = Dedup("k", 1.5)  # type: ignore[arg-type]  # ms are whole
    for bad, field in ((Dedup("", 5), "dedup.key"), (Dedup("k", 0), "dedup.ttlSeconds"),
                       (Dedup("k", MAX_DEDUP_TTL_MS + 1), "dedup.ttlSeconds"),
                       (Dedup("k", 5, "often"), "dedup.mode"), (fractional, "dedup.ttlSeconds")):
        with pytest.raises(ValidationError) as e:
            check_dedup(JobSpec("t", dedup=bad))
        assert e.value.field == field, bad
    with pytest.raises(ValidationError) as e:
        check_dedup(JobSpec("t", dedup=("k", 5)))  # type: ignore[arg-type]
    assert e.value.field == "dedup"


def test_a_key_is_compared_in_nfc_and_each_mode_passes() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert check_dedup(JobSpec("t", dedup=Dedup(decomposed, 5))).key == composed
    for mode in ("ttl", "untilDone", "debounce"):
        assert check_dedup(JobSpec("t", dedup=Dedup("k", 5, mode))).mode == mode


def test_a_dedup_key_places_its_record_and_its_jobs_in_one_partition() -> None:
    p = dedup_partition("tenant-42", 16)
    assert p == partition_for_key("tenant-42", 16)
    assert keys.slot(keys.dedup(p, "tenant-42")) == keys.slot(keys.due(p))
    q, job_id = keyed_job_id("idem-1", 16, "tenant-42")  # beside an idempotency key
    assert q == p == partition_of(job_id)
    assert keyed_job_id("idem-1", 16)[1].split("-", 1)[1] == job_id.split("-", 1)[1]


def test_a_record_key_never_reads_as_a_job_key_whatever_the_dedup_key_holds() -> None:
    record = keys.dedup(3, "x}:job:y")
    assert ":job:" not in record and keys.slot(record) == keys.slot(keys.due(3))


def test_an_idempotent_body_includes_its_dedup_window_but_not_a_debounced_run_at() -> None:
    def body_hash(**kw: Any) -> str:
        return prepare(JobSpec("t", idempotency_key="i", **kw), "1-x", NOW, 1 << 20).body_hash

    plain = body_hash()
    assert body_hash(dedup=Dedup("k", 5)) != plain
    assert body_hash(dedup=Dedup("k", 5)) != body_hash(dedup=Dedup("k", 6))
    debounced = Dedup("k", 5, "debounce")
    assert body_hash(dedup=debounced, run_at=NOW + 5) == body_hash(dedup=debounced,
                                                                   run_at=NOW + 9)
