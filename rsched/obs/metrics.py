"""Prometheus metrics: each process's own counters, and the cluster's state read from Redis.

Workers count runs in plain dicts and lists (one dict increment and one bisect per run, no lock
and no prometheus-client call on the hot path); a collector turns them into metric families
only when Prometheus scrapes; the service counts created jobs the same way, in
rsched.core.tally.  Dispatchers count per claim round, so they use prometheus-client counters
directly.  Every process can serve its metrics on a port of its own (``serve``); the
API's ``/metrics`` adds the cluster view (``cluster_families`` of rsched.service.status's
``op_cluster``): backlog, oldest due age, leases, queue streams, dead letters and archiver lag
per partition, read from Redis at scrape time.  This module reads nothing itself: it imports
only rsched.core, so every layer may count here.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
from prometheus_client.registry import Collector

from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.tally import SCHEDULED
from rsched.core.views import LAG_BUCKETS_S, Cluster

DURATION_BUCKETS_S = (0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
RUN_EVENTS = ("started", "succeeded", "failed", "timed_out", "retried", "reclaimed", "fenced",
              "dead_lettered", "cancelled", "deferred", "held")  # deferred: RateLimited,
# held: its queue's limit gave it no permit (both also retried)

OTHER = "other"  # the label value every type (or queue) past the cap shares

__all__ = [
    "CONTENT_TYPE_LATEST", "LAG_BUCKETS_S", "OTHER", "ArchiveLagCollector", "LabelCap",
    "RunMetrics", "cluster_families", "render", "serve",
]


# --- label cardinality: job types and queues are named by clients -----------------------------


class LabelCap:
    """At most ``limit`` values of a label get series of their own, the rest share `OTHER`: a
    client creating jobs of many types cannot make every scrape grow.  The values kept are the
    largest by volume when the cap fills, then kept for the life of the process, so a counter
    never moves between series and none goes backwards."""

    def __init__(self, limit: int = defaults.METRICS_MAX_LABELS) -> None:
        self.limit = limit
        self.kept: set[str] = set()
        self._lock = threading.Lock()

    def mapper(self, volumes: dict[str, float]) -> Callable[[str], str]:
        """Label value -> the value shown, after admitting the largest of ``volumes`` while
        there is room."""
        with self._lock:
            if len(self.kept) < self.limit:
                for value in sorted(volumes, key=lambda v: (-volumes[v], v)):
                    if len(self.kept) >= self.limit:
                        break
                    self.kept.add(value)
            kept = frozenset(self.kept)
        return lambda value: value if value in kept else OTHER


def _volumes(counts: Iterable[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for value, n in counts:
        out[value] += n
    return out


def _merge_series(series: dict[str, list[float]], label: Callable[[str], str]
                  ) -> dict[str, list[float]]:
    """Histogram series with their labels mapped, those mapped alike summed."""
    out: dict[str, list[float]] = {}
    for value, counts in series.items():
        acc = out.setdefault(label(value), [0.0] * len(counts))
        for i, v in enumerate(counts):
            acc[i] += v
    return out


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
    # Runs started per partition, since the process began: the heartbeat adds what is new to
    # the partition's stats hash, the cluster-wide total that outlives this worker.
    started_in: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))

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
    def __init__(self) -> None:
        self.types = LabelCap()
        self.queues = LabelCap()

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
        type_of = self.types.mapper(_volumes((t, n) for (_, t, _), n in counts.items()))
        queue_of = self.queues.mapper(_volumes((q, n) for (_, _, q), n in counts.items()))
        capped: dict[tuple[str, str, str], int] = defaultdict(int)
        for (e, t, q), n in counts.items():
            capped[(e, type_of(t), queue_of(q))] += n
        for event in RUN_EVENTS:
            fam = CounterMetricFamily(f"rsched_runs_{event}", f"Runs {event.replace('_', ' ')}",
                                      labels=["type", "queue"])
            for (e, t, q), n in sorted(capped.items()):
                if e == event:
                    fam.add_metric([t, q], n)
            yield fam
        yield _histogram("rsched_start_lag_seconds",
                         "From when a first attempt was meant to start to its start", "queue",
                         LAG_BUCKETS_S, _merge_series(lag, queue_of))
        yield _histogram("rsched_run_duration_seconds", "Handler run time per attempt", "type",
                         DURATION_BUCKETS_S, _merge_series(dur, type_of))
        yield GaugeMetricFamily("rsched_worker_inflight", "Runs this process is running",
                                value=sum(w.inflight() for w in workers))


REGISTRY.register(_WorkerCollector())


# --- per-process: scheduling and dispatching --------------------------------------------------

# Registered by export_dispatching, when this process runs a dispatcher: the API (or a worker)
# must not show a dispatcher's counters at zero.
DISPATCHED = Counter("rsched_dispatched", "Runs moved onto queue streams by this dispatcher",
                     registry=None)
SKIPPED = Counter("rsched_skipped", "Occurrences skipped by misfire=skip", registry=None)
LEASE_CHANGES = Counter("rsched_lease_changes", "Partition leases taken or given up",
                        ["change"], registry=None)
PARTITIONS_OWNED = Gauge("rsched_partitions_owned", "Partitions this dispatcher holds",
                         registry=None)
CLAIM_ROUND = Histogram("rsched_claim_round_seconds", "One claim round over owned partitions",
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                        registry=None)
# An HTTP target worker's requests (rsched worker --http; docs/http-targets.md), registered by
# export_http.
HTTP_REQUESTS = Counter("rsched_http_requests", "HTTP target requests by queue and status class "
                        "(2xx, 3xx, 4xx, 5xx, or error: no response)", ["queue", "status_class"],
                        registry=None)
HTTP_LATENCY = Histogram("rsched_http_request_seconds", "HTTP target request latency, to the "
                         "response's body read", ["queue"], buckets=DURATION_BUCKETS_S,
                         registry=None)
_HTTP = (HTTP_REQUESTS, HTTP_LATENCY)
EVENTS_TRIMMED = Counter("rsched_events_trimmed", "Events stream entries this dispatcher trimmed "
                         "(to the archivers' read point, or to RSCHED_EVENTS_KEEP(_MS))",
                         registry=None)
_DISPATCHING = (DISPATCHED, SKIPPED, LEASE_CHANGES, PARTITIONS_OWNED, CLAIM_ROUND,
                EVENTS_TRIMMED)
_dispatching_exported: list[bool] = []


def export_http() -> None:
    """Export the HTTP target metrics from this process (once)."""
    with _lock:
        if not _http_exported:
            for m in _HTTP:
                REGISTRY.register(m)
            _http_exported.append(True)


_http_exported: list[bool] = []


def export_dispatching() -> None:
    """Export the dispatcher's metrics from this process (once, whatever the dispatchers)."""
    with _lock:
        if not _dispatching_exported:
            for m in _DISPATCHING:
                REGISTRY.register(m)
            _dispatching_exported.append(True)


class _ScheduledCollector:
    """Jobs this process created (rsched.core.tally.SCHEDULED, counted by the service)."""

    def __init__(self) -> None:
        self.types = LabelCap()
        self.queues = LabelCap()

    def collect(self) -> Iterator[Metric]:
        counts = SCHEDULED.snapshot()
        type_of = self.types.mapper(_volumes((t, n) for (t, _), n in counts.items()))
        queue_of = self.queues.mapper(_volumes((q, n) for (_, q), n in counts.items()))
        capped: dict[tuple[str, str], int] = defaultdict(int)
        for (t, q), n in counts.items():
            capped[(type_of(t), queue_of(q))] += n
        fam = CounterMetricFamily("rsched_jobs_scheduled", "Jobs created",
                                  labels=["type", "queue"])
        for (t, q), n in sorted(capped.items()):
            fam.add_metric([t, q], n)
        yield fam


REGISTRY.register(_ScheduledCollector())


class LagReading(Protocol):
    """The archive's lag as rsched.archive.lag.Lag reports it (read outside this module)."""

    @property
    def by_partition(self) -> dict[int, int]: ...
    @property
    def seconds(self) -> float: ...
    @property
    def pending(self) -> int: ...
    @property
    def applied_until_ms(self) -> int: ...


class ArchiveLagCollector:
    """The archive's backlog, read when scraped (an archiver's own port); ``read`` returns
    None while Redis is away, and the scrape then answers with the process's own metrics."""

    def __init__(self, read: Callable[[], LagReading | None]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        lag = self.read()
        if lag is None:
            return
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
        yield GaugeMetricFamily("rsched_job_index_applied_timestamp_seconds", "The job index "
                                "(filtered listings) holds every change made before this time "
                                "(Redis's clock): the index lags time() minus this",
                                value=lag.applied_until_ms / 1000)


def serve(address: str | int | None, collectors: Sequence[Collector] = ()) -> int | None:
    """Serve this process's metrics from a daemon thread on ``PORT`` or ``HOST:PORT`` (all
    interfaces by default, so a fleet can be scraped); returns the port, None when not asked.
    An archiver adds an ArchiveLagCollector to export the archive's lag too."""
    if address in (None, "", 0, "0"):
        return None
    host, _, port = str(address).rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError("--metrics-port", f"expected PORT or HOST:PORT, got {address!r}")
    for collector in collectors:
        REGISTRY.register(collector)
    try:
        server, _ = start_http_server(int(port), host or "0.0.0.0")
    except OSError as e:
        raise ValidationError("--metrics-port", f"cannot listen on {address}: {e}") from None
    return int(server.server_address[1])


# --- the cluster view, read from Redis by rsched.service.status.op_cluster --------------------


def cluster_families(c: Cluster) -> Iterator[Metric]:
    """Metric families of a cluster view, one series per partition where it applies."""
    parts = c.status.partitions

    def gauge(name: str, doc: str, values: Iterable[float]) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=["partition"])
        for pt, v in zip(parts, values, strict=True):
            fam.add_metric([str(pt.partition)], v)
        return fam

    yield gauge("rsched_due_backlog", "Jobs due now and not yet dispatched",
                (pt.due_backlog for pt in parts))
    yield gauge("rsched_retry_backlog", "Retries due now and not yet dispatched",
                (pt.retry_backlog for pt in parts))
    yield gauge("rsched_oldest_due_age_seconds", "Age of the oldest due, undispatched job",
                (pt.oldest_due_age_ms * 0.001 for pt in parts))
    yield gauge("rsched_dead_letters", "Dead-lettered runs", (pt.dead_letters for pt in parts))
    yield gauge("rsched_lease_fence", "Fencing token of the partition's lease",
                (pt.fence for pt in parts))
    yield gauge("rsched_archiver_lag_events", "Events-stream entries the archiver has not read "
                "yet (an entry holds one event or a script call's events)",
                (pc.archiver_lag for pc in c.counters))
    yield gauge("rsched_archiver_pending_events", "Events read by an archiver, not yet committed",
                (pc.archiver_pending for pc in c.counters))
    yield gauge("rsched_partition_owned", "1 if a live dispatcher holds the lease",
                (1 if pt.owner else 0 for pt in parts))
    for name in sorted({k for pc in c.counters for k in pc.stats}):
        fam = CounterMetricFamily(f"rsched_partition_{name}", f"Partition counter {name}",
                                  labels=["partition"])
        for pc in c.counters:
            fam.add_metric([str(pc.partition)], pc.stats.get(name, 0))
        yield fam
    yield from _queue_and_member_families(c)
    waiting = GaugeMetricFamily("rsched_limit_waiting", "Runs waiting for a limit, by "
                                "definition name (docs/limits.md)", labels=["limit"])
    deferred = CounterMetricFamily("rsched_limit_deferred", "Runs that started waiting for a "
                                   "limit, by definition name", labels=["limit"])
    in_flight = GaugeMetricFamily("rsched_limit_in_flight", "Runs holding a slot of a limit "
                                  "key, by definition name", labels=["limit"])
    for lim in c.limits:
        waiting.add_metric([lim.name], lim.waiting)
        deferred.add_metric([lim.name], lim.deferred)
        in_flight.add_metric([lim.name], lim.in_flight)
    yield waiting
    yield deferred
    yield in_flight


def _queue_and_member_families(c: Cluster) -> Iterator[Metric]:
    s = c.status
    # The longest queues by name, the others summed as `other` (a gauge may move between
    # series from one scrape to the next; a counter may not).
    queue_of = LabelCap().mapper({q.queue: q.length for q in s.queues})
    for doc, attr in (("Entries in the queue's streams", "length"),
                      ("Entries delivered to a worker and not yet acknowledged", "pending")):
        qfam = GaugeMetricFamily(f"rsched_queue_{attr}", doc, labels=["queue"])
        values = _volumes((queue_of(q.queue), getattr(q, attr)) for q in s.queues)
        for queue, value in sorted(values.items()):
            qfam.add_metric([queue], value)
        yield qfam
    waiting = GaugeMetricFamily(
        "rsched_runs_waiting_for_handler", "Runs that workers without their job type's handler "
        "set aside, waiting for one that has it; served: a live worker with the handler reads "
        "the queue (docs/workers.md)", labels=["queue", "type", "served"])
    for hw in s.waiting:
        waiting.add_metric([hw.queue, hw.type, "true" if hw.served else "false"], hw.runs)
    yield waiting
    yield GaugeMetricFamily("rsched_dispatchers", "Registered dispatchers",
                            value=len(s.dispatchers))
    workers = [w for w in s.workers if w.alive]
    yield GaugeMetricFamily("rsched_workers", "Live workers", value=len(workers))
    inflight = GaugeMetricFamily("rsched_worker_runs_inflight", "Runs a worker is running",
                                 labels=["worker"])
    for w in workers:
        inflight.add_metric([w.id], w.inflight)
    yield inflight
    yield CounterMetricFamily("rsched_cluster_runs_started", "Runs started in the cluster, as "
                              "workers add them to Redis at each heartbeat (a worker killed "
                              "between two beats leaves its last few out)", value=c.runs_started)
    yield _histogram("rsched_cluster_start_lag_seconds", "Start lag over live workers", "",
                     LAG_BUCKETS_S, {"": list(c.start_lag)})


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def render(cluster: Cluster | None = None, registry: CollectorRegistry = REGISTRY) -> bytes:
    """The process's metrics, then the cluster view if given, in Prometheus text format."""
    out = generate_latest(registry)
    if cluster is not None:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Fixed(list(cluster_families(cluster))))
        out += generate_latest(reg)
    return out
