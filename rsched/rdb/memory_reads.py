"""What Redis's memory is made of, as `rsched doctor` projects it (rsched.service.memory): per
partition the backlogs, the events stream (its length, its MEMORY USAGE, whether a consumer
group reads it) and a few scheduled jobs' MEMORY USAGE; two round trips, no SCAN."""

from __future__ import annotations

from typing import Any, NamedTuple

from rsched.core.wire import as_text
from rsched.rdb import keys
from rsched.rdb.ops import Commands, Op, cmd

SAMPLED_JOBS = 3  # earliest due jobs per partition whose MEMORY USAGE is read


class PartitionMemory(NamedTuple):
    """One partition as the memory read sees it."""

    due: int  # scheduled jobs and occurrences waiting (ZCARD due)
    dead: int  # dead letters (never expire)
    events: int  # events stream entries (XLEN)
    events_bytes: int  # its MEMORY USAGE (sampled: approximate for a long stream)
    groups: int  # consumer groups reading it (archivers)


class MemoryFacts(NamedTuple):
    """Every partition's PartitionMemory and the mean MEMORY USAGE of a sampled scheduled job
    (None: no job to sample)."""

    partitions: list[PartitionMemory]
    job_bytes: float | None


def _int(v: Any) -> int:
    """A count or size reply; 0 for none (MEMORY USAGE of a missing key) or an error."""
    return v if isinstance(v, int) else 0


def op_read_memory(partitions: int) -> Op[MemoryFacts]:
    """The memory facts of ``partitions`` partitions."""
    per = 6
    res = yield Commands([c for p in range(partitions) for c in (
        cmd("zcard", keys.due(p)), cmd("zcard", keys.dead(p)), cmd("xlen", keys.events(p)),
        cmd("memory_usage", keys.events(p)), cmd("xinfo_groups", keys.events(p)),
        cmd("zrange", keys.due(p), 0, SAMPLED_JOBS - 1))], raise_on_error=False)
    parts, sampled = [], []
    for p in range(partitions):
        due, dead, n, size, groups, ids = res[p * per:(p + 1) * per]
        parts.append(PartitionMemory(_int(due), _int(dead), _int(n), _int(size),
                                     len(groups) if isinstance(groups, list) else 0))
        if isinstance(ids, list):
            sampled += [keys.job(p, as_text(i)) for i in ids]
    sizes: list[int] = []
    if sampled:
        replies = yield Commands([cmd("memory_usage", k) for k in sampled], raise_on_error=False)
        sizes = [int(s) for s in replies if isinstance(s, int)]
    return MemoryFacts(parts, sum(sizes) / len(sizes) if sizes else None)
