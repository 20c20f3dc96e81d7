"""Job ids: ``<partition>-<ULID>``, so the partition is read off the id and ids sort by creation."""

from __future__ import annotations

import hashlib
import os
import time
import zlib


def ulid(now_ms: int | None = None) -> str:
    """48-bit ms timestamp + 64 random bits as 28 hex digits: sorts by creation time, and
    bytes.hex runs in C (base64.b32encode is pure Python on 3.11 and cost 14 us an id)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return (ms.to_bytes(6, "big") + os.urandom(8)).hex()


def partition_for_key(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def new_job_id(partitions: int, idempotency_key: str | None = None) -> str:
    """Random id, or one derived from the idempotency key so a repeat lands on the same job."""
    if idempotency_key is None:
        token = ulid()
        # Hex digits 12-15 are random (the first 12 are the timestamp): they pick the partition.
        return f"{int(token[12:16], 16) % partitions}-{token}"
    p = partition_for_key(idempotency_key, partitions)
    digest = hashlib.blake2b(idempotency_key.encode(), digest_size=16).hexdigest()
    return f"{p}-k{digest}"


def run_id(job_id: str, sched_ms: int) -> str:
    """Deterministic: one occurrence, one run id (handlers may deduplicate on it)."""
    return f"{job_id}@{sched_ms}"
