"""Projected Redis memory, as `rsched doctor` shows it: what the scheduled backlog takes now
(sampled jobs' MEMORY USAGE times the backlog), what finished jobs will take at the current rate
for as long as RSCHED_FINISHED_TTL_MS keeps them, what the events streams take at their bound,
and the dead letters, which never expire.  Figures that cannot be read live (a finished job's
size: no index finds one without a SCAN) come from core.defaults, measured by
tests/processes/test_memory_bound.py (docs/memory.md)."""

from __future__ import annotations

from dataclasses import dataclass

from rsched.core import defaults
from rsched.core.settings import Settings
from rsched.rdb.memory_reads import MemoryFacts, op_read_memory
from rsched.rdb.ops import Op
from rsched.service.context import Service
from rsched.service.doctor import Finding
from rsched.service.samples import op_samples

RATE_WINDOW_MS = 3_600_000  # the finishing rate: over the overview's samples of the last hour


@dataclass(frozen=True, slots=True)
class MemoryPart:
    """One part of the projection: its name, bytes, and how they were reckoned."""

    part: str
    bytes: int
    how: str


def finish_rate(samples: list[dict[str, object]]) -> float | None:
    """Runs ending per second (succeeded and failed) between the oldest and newest sample of
    the overview's history (None: fewer than two, as when no API process has sampled)."""
    if len(samples) < 2:
        return None
    a, b = samples[0], samples[-1]
    span = (int(str(b.get("at", b["t"]))) - int(str(a.get("at", a["t"])))) / 1000
    done = sum(int(str(b[k])) - int(str(a[k])) for k in ("succeeded", "failed"))
    return max(done, 0) / span if span > 0 else None


def project(facts: MemoryFacts, settings: Settings, rate: float | None) -> list[MemoryPart]:
    """The projection's parts, the total last."""
    parts = facts.partitions
    due = sum(p.due for p in parts)
    job = facts.job_bytes or defaults.SCHEDULED_JOB_BYTES
    out = [MemoryPart("scheduled", int(due * job),
                      f"{due} due x {job:.0f} B ({'measured' if facts.job_bytes else 'typical'})")]
    ttl_s = settings.finished_ttl_ms / 1000
    if rate is None:
        out.append(MemoryPart("finished", 0, "no rate yet: the API samples the counters "
                              "once a minute (rsched api)"))
    elif not ttl_s:
        out.append(MemoryPart("finished", 0, "RSCHED_FINISHED_TTL_MS is 0: finished jobs are "
                              "kept for ever, growing by the rate below"))
    else:
        kept = rate * ttl_s
        out.append(MemoryPart("finished", int(kept * defaults.FINISHED_JOB_BYTES),
                              f"{rate:.1f} runs/s x {ttl_s / 3600:g} h (RSCHED_FINISHED_TTL_MS) "
                              f"x {defaults.FINISHED_JOB_BYTES} B"))
    read = [p for p in parts if p.groups]
    free = [p for p in parts if not p.groups]
    entries = sum(p.events for p in parts)
    entry = (sum(p.events_bytes for p in parts) / entries if entries
             else defaults.EVENT_ENTRY_BYTES)
    bound = len(free) * (settings.events_keep + defaults.STREAM_NODE_ENTRIES) * entry
    waiting = sum(p.events_bytes for p in read)
    how = (f"{len(free)} streams x {settings.events_keep} entries (RSCHED_EVENTS_KEEP) x "
           f"{entry:.0f} B" if settings.events_keep else "RSCHED_EVENTS_KEEP is 0: unbounded")
    if read:
        how += f"; {len(read)} read by an archiver: {waiting} B not archived yet"
    out.append(MemoryPart("events", int(bound + waiting), how))
    dead = sum(p.dead for p in parts)
    out.append(MemoryPart("dead letters", dead * defaults.FINISHED_JOB_BYTES,
                          f"{dead} x {defaults.FINISHED_JOB_BYTES} B, kept until purged"))
    out.append(MemoryPart("total", sum(p.bytes for p in out), "projected"))
    return out


def op_projection(svc: Service, partitions: int) -> Op[list[MemoryPart]]:
    """Read the facts and the rate, and project."""
    facts = yield from op_read_memory(partitions)
    now = yield from svc.op_now()
    samples = yield from op_samples(svc, now - RATE_WINDOW_MS)
    return project(facts, svc.settings, finish_rate(samples))


def findings(parts: list[MemoryPart]) -> list[Finding]:
    """The projection as `rsched doctor` lists it: one row a part, in MB."""
    return [Finding(f"memory {p.part}", "ok", f"{p.bytes / 1e6:,.1f} MB: {p.how}")
            for p in parts]
