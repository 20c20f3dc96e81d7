"""Job ids: ``<partition>-<ULID>``, so the partition is read off the id and ids sort by creation."""

from __future__ import annotations

import hashlib
import os
import time
import zlib

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32, as ULID uses


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def ulid(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return _b32(ms, 10) + _b32(int.from_bytes(os.urandom(10), "big"), 16)


def partition_for_key(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def new_job_id(partitions: int, idempotency_key: str | None = None) -> str:
    """Random id, or one derived from the idempotency key so a repeat lands on the same job."""
    if idempotency_key is None:
        token = ulid()
        return f"{int.from_bytes(os.urandom(2), 'big') % partitions}-{token}"
    p = partition_for_key(idempotency_key, partitions)
    digest = hashlib.blake2b(idempotency_key.encode(), digest_size=16).hexdigest()
    return f"{p}-k{digest}"


def run_id(job_id: str, sched_ms: int) -> str:
    """Deterministic: the same occurrence always gets the same run id (handlers may dedupe on it)."""
    return f"{job_id}@{sched_ms}"
