"""The overview's history: samples of the cluster's counters, one per STATS_SAMPLE_MS, kept in
Redis for STATS_KEEP_MS, so the dashboard's charts show the last hour at once instead of
starting empty on every load.

Each sample holds what the dashboard otherwise reads off /metrics (rsched.api.static.charts):
runs started (live workers' heartbeats), succeeded and failed (the partitions' stats hashes),
cumulative start-lag bucket counts, and the due and retry backlogs.  The dashboard turns
differences of consecutive samples into rates and lag percentiles, as it does live.

Nothing on the engine's hot path writes here: an API process takes a sample with the reads
/metrics makes (rsched.service.status.op_cluster), ZADDs it under its bucket's start time and
trims what is older than STATS_KEEP_MS.  Several API processes may sample the same bucket; the
reader keeps one per bucket.  While no API process runs, no sample is taken (a gap).
"""

from __future__ import annotations

import json
from typing import Any

from rsched.core import defaults
from rsched.core.views import LAG_BUCKETS_S, Cluster
from rsched.rdb import keys, shared_keys
from rsched.rdb.ops import Op
from rsched.rdb.shared_keys import op_add_sample
from rsched.service.context import Service
from rsched.service.status import op_cluster

SAMPLES_KEY = keys.stats_samples()
MAX_SAMPLES = 720  # read at most this many (an hour of 5 s samples)


def sample_of(cluster: Cluster, t_ms: int) -> dict[str, Any]:
    """The sample of one bucket; ``lag`` as cumulative [le, count] pairs, le None for +Inf."""
    stats = [pc.stats for pc in cluster.counters]
    cum, lag = 0.0, []
    for le, n in zip((*LAG_BUCKETS_S, None), cluster.start_lag[:-1], strict=True):
        cum += n
        lag.append([le, cum])
    parts = cluster.status.partitions
    return {
        "t": t_ms, "started": cluster.runs_started,
        "succeeded": sum(s.get("succeeded", 0) for s in stats),
        "failed": sum(s.get("failed", 0) for s in stats), "lag": lag,
        "due": sum(p.due_backlog for p in parts), "retry": sum(p.retry_backlog for p in parts),
        "oldest": max((p.oldest_due_age_ms for p in parts), default=0) / 1000,
    }


def op_record(svc: Service) -> Op[dict[str, Any]]:
    """Take this bucket's sample, store it and drop samples past STATS_KEEP_MS."""
    cluster = yield from op_cluster(svc)
    now = yield from svc.op_now()
    step = svc.settings.stats_sample_ms
    # t keys the bucket (one sample per bucket, whichever API takes it); at says when the
    # counters were read, which a rate needs (the first sample of an API comes mid-bucket).
    sample = dict(sample_of(cluster, now // step * step), at=now)
    yield from op_add_sample(json.dumps(sample, separators=(",", ":")), sample["t"],
                             now - defaults.STATS_KEEP_MS)
    return sample


def op_samples(svc: Service, since_ms: int) -> Op[list[dict[str, Any]]]:
    """The samples since ``since_ms``, oldest first, one per bucket (the newest MAX_SAMPLES)."""
    raw = yield from shared_keys.op_samples(since_ms, MAX_SAMPLES)
    out: dict[int, dict[str, Any]] = {}
    for item in raw:
        s = json.loads(item)
        out.setdefault(int(s["t"]), s)
    return [out[t] for t in sorted(out)]


__all__ = ["MAX_SAMPLES", "SAMPLES_KEY", "op_record", "op_samples", "sample_of"]
