"""Job ids: short, sorted by creation, the partition read off the front."""

from __future__ import annotations

import base64
import re

import pytest

from rsched.core import ids
from rsched.core.models import partition_of

ID_BODY = re.compile(r"[A-Za-z0-9_-]{19}")
NOW = 1_796_150_000_123


def test_sorted64_writes_base64_in_an_alphabet_that_sorts_like_the_numbers() -> None:
    numbers = [0, 1, 63, 64, 2**20, 2**41 - 1, 2**47, 2**48 - 1]
    texts = [ids.sorted64(n.to_bytes(6, "big")) for n in numbers]
    assert texts == sorted(texts)
    raw = bytes(range(0, 255, 3))
    plain = base64.urlsafe_b64encode(raw).decode()
    # The same digits as base64, each written by its own symbol: a bijection, so no randomness lost.
    mapping = dict(zip(plain, ids.sorted64(raw), strict=True))
    assert len(set(mapping.values())) == len(mapping)


@pytest.mark.parametrize("earlier, later", [(0, 1), (1_700_000_000_000, 1_700_000_000_001),
                                            (1_796_000_000_000, 2**42 - 1)])
def test_ids_sort_by_creation_time(earlier: int, later: int) -> None:
    assert ids.ulid(earlier) < ids.ulid(later)
    assert ids.stamp(earlier) < ids.stamp(later)


def test_a_batch_of_ids_is_short_distinct_and_read_back_to_its_partition() -> None:
    job_ids = ids.random_job_ids(5000, 13, NOW)
    assert len(set(job_ids)) == 5000
    for job_id in job_ids:
        head, _, body = job_id.partition("-")
        assert head == "13" and partition_of(job_id) == 13
        assert ID_BODY.fullmatch(body), job_id
    stamp = job_ids[0].partition("-")[2][: ids.STAMP_CHARS]
    assert all(j.partition("-")[2].startswith(stamp) for j in job_ids)  # one clock reading
    assert ids.random_job_ids(0, 13, NOW) == []


def test_a_batch_starts_at_any_partition() -> None:
    drawn = [ids.random_partition(16) for _ in range(2000)]
    assert set(drawn) == set(range(16))


def test_the_random_part_carries_72_bits() -> None:
    job_ids = ids.random_job_ids(2000, 0, NOW)
    rand = [j.partition("-")[2][ids.STAMP_CHARS:] for j in job_ids]
    assert {len(x) for x in rand} == {12}  # 12 characters of 6 bits
    # Every symbol turns up in every position: none is fixed (2,000 draws of 64 symbols).
    assert all(len({x[k] for x in rand}) == 64 for k in range(12))


def test_keyed_ids_are_derived_from_the_key_alone() -> None:
    p, job_id = ids.keyed_job_id("order-42", 16)
    assert (p, job_id) == ids.keyed_job_id("order-42", 16)
    assert job_id != ids.keyed_job_id("order-43", 16)[1]
    assert partition_of(job_id) == p and job_id.startswith(f"{p}-k")
    assert ID_BODY.fullmatch(job_id.partition("-")[2][1:][:19])
    assert len(job_id.partition("-")[2]) == 21


# 48 << 36 (in 2074): a stamp that starts with 'k', as a keyed id's body does
@pytest.mark.parametrize("ms", [0, 1, NOW, 48 << 36, 2**42 - 1])
def test_a_random_id_carries_its_creation_time_and_a_keyed_one_none(ms: int) -> None:
    (job_id,) = ids.random_job_ids(1, 7, ms)
    assert ids.created_ms_of(job_id) == ms
    assert ids.created_ms_of(f"3-{ids.ulid(ms)}") == ms
    assert ids.created_ms_of(ids.keyed_job_id("order-42", 16)[1]) is None
