"""Prometheus metrics: each process's own counters, and the cluster's state read from Redis.

Workers count runs in plain dicts and lists (one dict increment and one bisect per run, no lock
and no prometheus-client call on the hot path); a collector turns them into metric families
only when Prometheus scrapes.  Dispatchers count per claim round, so they use prometheus-client
counters directly.  Every process can serve its metrics on a port of its own (``serve``); the
API's ``/metrics`` adds the cluster view (``read_cluster``): backlog, oldest due age, leases,
queue streams, dead letters and archiver lag per partition, read from Redis at scrape time.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rsched.core.errors import ValidationError
from rsched.rdb import keys

if TYPE_CHECKING:  # rsched.client counts scheduled jobs here: import it lazily
    from rsched.client import ClientBase, Op

# Scheduled time -> start, in seconds: a healthy cluster starts runs in milliseconds.
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS_S = (0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
RUN_EVENTS = ("started", "succeeded", "failed", "timed_out", "retried", "reclaimed", "fenced",
              "dead_lettered")

__all__ = [
    "CONTENT_TYPE_LATEST", "RunMetrics", "count_scheduled", "op_cluster", "render", "serve",
]


# --- per-process: runs counted by the worker --------------------------------------------------


class Buckets:
    """Histogram counts per label value: ``[n(<=b0), ..., n(<=bk), n(+Inf only), sum]``."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.series: dict[str, list[float]] = {}

    def observe(self, label: str, value: float) -> None:
        s = self.series.get(label)
        if s is None:
            s = self.series[label] = [0] * (len(self.bounds) + 2)
        s[bisect_left(self.bounds, value)] += 1
        s[-1] += value

    def total(self) -> list[float]:
        """Every label's counts summed (the heartbeat's cluster-wide share)."""
        out = [0.0] * (len(self.bounds) + 2)
        for s in list(self.series.values()):
            for i, v in enumerate(s):
                out[i] += v
        return out


def _histogram(name: str, doc: str, label: str, bounds: tuple[float, ...],
               series: dict[str, list[float]]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=[label] if label else [])
    for value, counts in series.items():
        cum, buckets = 0.0, []
        for b, n in zip((*bounds, float("inf")), counts[:-1], strict=True):
            cum += n
            buckets.append((_le(b), cum))
        fam.add_metric([value] if label else [], buckets, counts[-1])
    return fam


def _le(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


@dataclass(eq=False)
class RunMetrics:
    """One worker's runs: ``count`` per (event, type, queue), start lag by queue, duration by
    type.  Instances register themselves; the process collector sums them at scrape time."""

    counts: defaultdict[tuple[str, str, str], int] = field(
        default_factory=lambda: defaultdict(int))
    lag: Buckets = field(default_factory=lambda: Buckets(LAG_BUCKETS_S))
    duration: Buckets = field(default_factory=lambda: Buckets(DURATION_BUCKETS_S))
    inflight: Callable[[], int] = lambda: 0

    def __post_init__(self) -> None:
        with _lock:
            _workers.append(self)

    def count(self, event: str, type: str, queue: str, n: int = 1) -> None:
        self.counts[(event, type, queue)] += n

    def heartbeat(self) -> dict[str, Any]:
        """What the worker's heartbeat record carries, so the API can show cluster-wide
        throughput and start-lag percentiles without scraping every worker."""
        started = sum(n for (e, _, _), n in list(self.counts.items()) if e == "started")
        return {"started": started, "lag": self.lag.total()}


_lock = threading.Lock()
_workers: list[RunMetrics] = []


class _WorkerCollector:
    def collect(self) -> Iterator[Metric]:
        with _lock:
            workers = list(_workers)
        if not workers:
            return
        counts: dict[tuple[str, str, str], int] = defaultdict(int)
        lag: dict[str, list[float]] = {}
        dur: dict[str, list[float]] = {}
        for w in workers:
            for k, n in list(w.counts.items()):
                counts[k] += n
            for src, dst in ((w.lag.series, lag), (w.duration.series, dur)):
                for label, s in list(src.items()):
                    acc = dst.setdefault(label, [0.0] * len(s))
                    for i, v in enumerate(list(s)):
                        acc[i] += v
        for event in RUN_EVENTS:
            fam = CounterMetricFamily(f"rsched_runs_{event}", f"Runs {event.replace('_', ' ')}",
                                      labels=["type", "queue"])
            for (e, t, q), n in sorted(counts.items()):
                if e == event:
                    fam.add_metric([t, q], n)
            yield fam
        yield _histogram("rsched_start_lag_seconds", "Scheduled time to start of first attempts",
                         "queue", LAG_BUCKETS_S, lag)
        yield _histogram("rsched_run_duration_seconds", "Handler run time per attempt", "type",
                         DURATION_BUCKETS_S, dur)
        yield GaugeMetricFamily("rsched_worker_inflight", "Runs this process is running",
                                value=sum(w.inflight() for w in workers))


REGISTRY.register(_WorkerCollector())


# --- per-process: scheduling and dispatching --------------------------------------------------

JOBS_SCHEDULED = Counter("rsched_jobs_scheduled", "Jobs created", ["type", "queue"])
DISPATCHED = Counter("rsched_dispatched", "Runs moved onto queue streams by this dispatcher")
SKIPPED = Counter("rsched_skipped", "Occurrences skipped by misfire=skip")
LEASE_CHANGES = Counter("rsched_lease_changes", "Partition leases taken or given up",
                        ["change"])
PARTITIONS_OWNED = Gauge("rsched_partitions_owned", "Partitions this dispatcher holds")
CLAIM_ROUND = Histogram("rsched_claim_round_seconds", "One claim round over owned partitions",
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))


def count_scheduled(created: Iterable[tuple[str, str]]) -> None:
    """Count created jobs given as (type, queue): one counter call per distinct pair."""
    for (t, q), n in Tally(created).items():
        JOBS_SCHEDULED.labels(t, q).inc(n)


class _ArchiveLag:
    """The archive's backlog, read from Redis when scraped (an archiver's own port)."""

    def __init__(self, redis_url: str) -> None:
        from redis import Redis

        self.r = Redis.from_url(redis_url, socket_timeout=5)

    def collect(self) -> Iterator[Metric]:
        from redis.exceptions import RedisError

        from rsched.archive.lag import archive_lag

        try:
            lag = archive_lag(self.r, int(self.r.hget(keys.config(), "partitions") or 0))
        except RedisError:
            return  # Redis is away: the scrape still answers with the process's own metrics
        fam = GaugeMetricFamily("rsched_archiver_lag_events", "Events-stream entries not "
                                "archived yet (an entry holds one event or a script call's events)",
                                labels=["partition"])
        for p, n in sorted(lag.by_partition.items()):
            fam.add_metric([str(p)], n)
        yield fam
        yield GaugeMetricFamily("rsched_archiver_lag_seconds", "Age of the oldest event not "
                                "archived yet", value=lag.seconds)
        yield GaugeMetricFamily("rsched_archiver_pending_events", "Events read by an archiver, "
                                "not yet committed", value=lag.pending)


def serve(address: str | int | None, *, archive_redis_url: str | None = None) -> int | None:
    """Serve this process's metrics from a daemon thread on ``PORT`` or ``HOST:PORT`` (all
    interfaces by default, so a fleet can be scraped); returns the port, None when not asked.
    An archiver passes its Redis URL to export the archive's lag too."""
    if address in (None, "", 0, "0"):
        return None
    host, _, port = str(address).rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError("--metrics-port", f"expected PORT or HOST:PORT, got {address!r}")
    if archive_redis_url:
        REGISTRY.register(_ArchiveLag(archive_redis_url))
    try:
        server, _ = start_http_server(int(port), host or "0.0.0.0")
    except OSError as e:
        raise ValidationError("--metrics-port", f"cannot listen on {address}: {e}") from None
    return int(server.server_address[1])


# --- the cluster view, read from Redis ----------------------------------------------------------


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _group(info: Any, name: str) -> dict[str, Any] | None:
    if isinstance(info, Exception):
        return None
    for g in info or ():
        g = {_s(k): v for k, v in g.items()}
        if _s(g.get("name")) == name:
            return g
    return None


def op_cluster(core: ClientBase) -> Op[dict[str, Any]]:
    """GET /status's view plus what only metrics show: each partition's counters, the
    archiver's lag, and the run counts and start-lag buckets live workers report."""
    from rsched.client import Commands, cmd
    from rsched.service.reads import op_status

    status = yield from op_status(core)
    parts = status["partitions"]
    cmds = [cmd("hgetall", keys.workers())]
    for pt in parts:
        p = pt["partition"]
        cmds += [cmd("hgetall", keys.stats(p)), cmd("xlen", keys.events(p)),
                 cmd("xinfo_groups", keys.events(p))]
    res = yield Commands(cmds, raise_on_error=False)
    for i, pt in enumerate(parts):
        stats, length, groups = res[1 + 3 * i: 4 + 3 * i]
        pt["stats"] = {_s(k): int(v) for k, v in stats.items()} if isinstance(stats, dict) else {}
        length = length if isinstance(length, int) else 0
        group = _group(groups, keys.EVENTS_GROUP)
        # Not archived yet = read by no archiver (the group's lag, Redis 7; XLEN bounds it) plus
        # read and not yet committed (pending), as rsched.archive.lag counts it.
        pending = int(group.get("pending") or 0) if group else 0
        unread = group.get("lag") if group else None
        pt["archiverLag"] = pending + (length if unread is None else int(unread))
        pt["archiverPending"] = pending
    live = {w["id"] for w in status["workers"] if w["alive"]}
    reports = []
    for wid, raw in (res[0] if isinstance(res[0], dict) else {}).items():
        if _s(wid) in live:
            try:
                reports.append(msgpack.unpackb(raw, raw=False).get("metrics") or {})
            except (ValueError, TypeError, AttributeError, msgpack.ExtraData):
                continue
    lag = [0.0] * (len(LAG_BUCKETS_S) + 2)
    for m in reports:
        counts = m.get("lag") or ()
        if len(counts) == len(lag):
            lag = [a + b for a, b in zip(lag, counts, strict=True)]
    status["runsStarted"] = sum(int(m.get("started") or 0) for m in reports)
    status["startLag"] = lag
    return status


def cluster_families(c: dict[str, Any]) -> Iterator[Metric]:
    """Metric families of an ``op_cluster`` answer, one series per partition where it applies."""
    parts = c["partitions"]

    def gauge(name: str, doc: str, key: str, scale: float = 1.0) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=["partition"])
        for pt in parts:
            fam.add_metric([str(pt["partition"])], pt[key] * scale)
        return fam

    yield gauge("rsched_due_backlog", "Jobs due now and not yet dispatched", "dueBacklog")
    yield gauge("rsched_retry_backlog", "Retries due now and not yet dispatched", "retryBacklog")
    yield gauge("rsched_oldest_due_age_seconds", "Age of the oldest due, undispatched job",
                "oldestDueAgeMs", 0.001)
    yield gauge("rsched_dead_letters", "Dead-lettered runs", "deadLetters")
    yield gauge("rsched_lease_fence", "Fencing token of the partition's lease", "fence")
    yield gauge("rsched_archiver_lag_events", "Events-stream entries the archiver has not read "
                "yet (an entry holds one event or a script call's events)",
                "archiverLag")
    yield gauge("rsched_archiver_pending_events", "Events read by an archiver, not yet committed",
                "archiverPending")
    owned = GaugeMetricFamily("rsched_partition_owned", "1 if a live dispatcher holds the lease",
                              labels=["partition"])
    for pt in parts:
        owned.add_metric([str(pt["partition"])], 1 if pt["owner"] else 0)
    yield owned
    for name in sorted({k for pt in parts for k in pt["stats"]}):
        fam = CounterMetricFamily(f"rsched_partition_{name}", f"Partition counter {name}",
                                  labels=["partition"])
        for pt in parts:
            fam.add_metric([str(pt["partition"])], pt["stats"].get(name, 0))
        yield fam
    for key, doc in (("length", "Entries in the queue's streams"),
                     ("pending", "Entries delivered to a worker and not yet acknowledged")):
        qfam = GaugeMetricFamily(f"rsched_queue_{key}", doc, labels=["queue"])
        for q in c["queues"]:
            qfam.add_metric([q["queue"]], q[key])
        yield qfam
    yield GaugeMetricFamily("rsched_dispatchers", "Registered dispatchers",
                            value=len(c["dispatchers"]))
    workers = [w for w in c["workers"] if w["alive"]]
    yield GaugeMetricFamily("rsched_workers", "Live workers", value=len(workers))
    inflight = GaugeMetricFamily("rsched_worker_runs_inflight", "Runs a worker is running",
                                 labels=["worker"])
    for w in workers:
        inflight.add_metric([w["id"]], w["inflight"])
    yield inflight
    yield CounterMetricFamily("rsched_cluster_runs_started", "Runs started by live workers",
                              value=c["runsStarted"])
    yield _histogram("rsched_cluster_start_lag_seconds", "Start lag over live workers", "",
                     LAG_BUCKETS_S, {"": c["startLag"]})


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def render(cluster: dict[str, Any] | None = None, registry: CollectorRegistry = REGISTRY) -> bytes:
    """The process's metrics, then the cluster view if given, in Prometheus text format."""
    out = generate_latest(registry)
    if cluster is not None:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Fixed(list(cluster_families(cluster))))
        out += generate_latest(reg)
    return out
