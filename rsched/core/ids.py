"""Job ids: ``<partition>-<stamp><random>``, so the partition is read off the id and ids sort by
creation.  The id is the one string repeated most in Redis (the job key, the due-set member,
each event, every run id), so it is written in 64 symbols a character, not 16."""

from __future__ import annotations

import binascii
import hashlib
import os
import socket
import time
import zlib

# URL-safe base64's 64 characters in ASCII order: a fixed-width number written in them sorts as
# the number does.  The id characters are then letters, digits, '-' and '_', safe in a URL, a
# key, a SCAN pattern and the '\n'-joined event columns.
_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SORTED = b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_TO_SORTED = bytes.maketrans(_B64, _SORTED)
_FROM_SORTED = bytes.maketrans(_SORTED, _B64)
RANDOM_BYTES = 9  # 72 random bits an id, 12 characters (9 bytes are whole base64 groups)
STAMP_CHARS = 7  # 42 bits of epoch ms: ids sort by creation until 2109 (as due scores are exact)


def sorted64(raw: bytes) -> str:
    """``raw`` (a multiple of 3 bytes: no padding) in sorted base64, 4 characters per 3 bytes;
    b2a_base64 and translate run in C, where a ulid in pure Python was a visible cost per job."""
    return binascii.b2a_base64(raw, newline=False).translate(_TO_SORTED).decode()


def stamp(now_ms: int) -> str:
    """The creation-time part of an id: the ms's low 42 bits, 7 characters."""
    return sorted64(now_ms.to_bytes(6, "big"))[8 - STAMP_CHARS:]


def created_ms_of(job_id: str) -> int | None:
    """The creation time a random id carries in its stamp (None: a keyed id, which has none).
    The job hash of a random-id job stores no created_ms: this is it (22 bytes a job)."""
    body = job_id.partition("-")[2]
    if len(body) != STAMP_CHARS + 4 * RANDOM_BYTES // 3:  # a keyed id's is 21 characters
        return None
    text = "-" * (8 - STAMP_CHARS) + body[:STAMP_CHARS]
    return int.from_bytes(binascii.a2b_base64(text.encode().translate(_FROM_SORTED)), "big")


def ulid(now_ms: int | None = None) -> str:
    """A 19-character id: 42-bit ms stamp + 72 random bits, sorting by creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return stamp(ms) + sorted64(os.urandom(RANDOM_BYTES))


def process_id(kind: str) -> str:
    """A process's default id, ``<kind>-<host>-<pid>-<6 chars>``: who it is in logs and Redis,
    and new on every start, so a restarted process never inherits a dead one's leases or runs."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{ulid()[-6:]}"


def partition_for_key(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def dedup_partition(dedup_key: str, partitions: int) -> int:
    """The partition of every job created under a dedup key: its record and those jobs share
    one slot, so schedule.lua checks and creates in one step, on Redis Cluster too."""
    return partition_for_key(dedup_key, partitions)


def random_job_ids(n: int, partition: int, now_ms: int) -> list[str]:
    """Ids of ``n`` new jobs of ``partition`` created at ``now_ms`` (the caller's reading of
    Redis's clock: the jobs' created_ms, see created_ms_of): one urandom and one base64 call
    for them all, since a ulid per job cost more than the rest of its id.  Ids are ulids as
    above, behind their partition."""
    size = RANDOM_BYTES
    rand = sorted64(os.urandom(size * n))
    head = f"{partition}-{stamp(now_ms)}"
    w = 4 * size // 3
    return [head + rand[w * k : w * k + w] for k in range(n)]


def random_partition(partitions: int) -> int:
    """A partition drawn at random: where a batch of new jobs starts (service.scheduling)."""
    return int.from_bytes(os.urandom(2), "big") % partitions


def keyed_job_id(idempotency_key: str, partitions: int, place: str | None = None
                 ) -> tuple[int, str]:
    """(partition, id) derived from the idempotency key, so a repeat lands on the same job:
    'k' and 120 bits of its hash (20 characters).  ``place`` (a job's limit key, else its dedup
    key) picks the partition instead, so a key's jobs share one: an idempotency key is then one
    per such key."""
    p = partition_for_key(idempotency_key if place is None else place, partitions)
    digest = hashlib.blake2b(idempotency_key.encode(), digest_size=15).digest()
    return p, f"{p}-k{sorted64(digest)}"


def run_id(job_id: str, sched_ms: int) -> str:
    """Deterministic: one occurrence, one run id (handlers may deduplicate on it)."""
    return f"{job_id}@{sched_ms}"
