"""What the job index keeps of a job (models.listed, read for every job a batch of events names)
is what Job.from_hash reads from the same hash, and the batch's jobs are found once each."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from rsched.archive.job_index import touched_jobs
from rsched.core.layout import JB, OWN
from rsched.core.models import Job, listed, pack_spec

SPEC = pack_spec(1000, 500, 5000, 0, "UTC", "run_once", 0, "order-7", None,
                 msgpack.packb({"a": 1}), 60_000, "", None)
HASHES: list[dict[bytes, Any]] = [
    {JB.type: b"email"},
    {JB.type: b"email", JB.queue: b"bulk", JB.status: b"paused", JB.next_ms: b"1893456000000",
     JB.created_ms: b"1700000000000", JB.updated_ms: b"1700000005000", JB.spec: SPEC},
    {JB.type: b"email", JB.status: b"cancelled", JB.next_ms: b"1893456000000",
     JB.last_run_id: b"3-abc@1700000000000"},
    {JB.type: b"email", JB.status: b"completed", JB.own_run: b"3-abc@1700000000000",
     OWN.ended_ms.encode(): b"1700000009000", JB.created_ms: b"1700000000000"},
    {JB.type: b"email", JB.spec: b"\xc1not msgpack"},
]


@pytest.mark.parametrize("h", HASHES)
def test_listed_reads_a_hash_as_from_hash_does(h: dict[bytes, Any]) -> None:
    for job_id in ("3-kX53SrbUGQzvae7s5_3tZ", "3-my-key"):
        job = Job.from_hash(h, job_id)
        got = listed(h, job_id)
        assert got == (job.type, job.queue, job.status.value, job.next_ms, job.created_ms,
                       job.updated_ms, job.last_run_id,
                       job.idempotency_key if JB.spec in h else None)


def test_a_batch_names_each_job_once_with_its_latest_event_and_what_it_says() -> None:
    entries = [
        (3, b"10-0", [b"e", b"scheduled", b"j", b"3-a", b"ty", b"email"]),
        (3, b"10-1", [b"e", b"dispatched", b"r", b"3-a@5", b"t", b"11"]),
        (3, b"11-0", [b"e", b"succeeded", b"r", b"3-a@5", b"t", b"12"]),
        (4, b"11-0", [b"e", b"started", b"j", b"4-b", b"r", b"4-b@6", b"t", b"13"]),
        (4, b"11-1", [b"e", b"fenced", b"j", b"4-b", b"r", b"4-b@6"]),
        (4, b"12-0", [b"e", b"fenced", b"j", b"", b"r", b"\xff@1"]),
    ]
    got = touched_jobs(entries)
    assert got["3-a"] == (3, 11, 0, True, ("3-a@5", ["succeeded", b"12", None]))
    # A later event that does not say the run's state: the run hash is read instead.
    assert got["4-b"] == (4, 11, 1, False, None)
    assert set(got) == {"3-a", "4-b"}
