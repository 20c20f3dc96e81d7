"""The archiver: every partition's events stream into the archive store, exactly once.

One batch: read up to ``batch`` entries per partition through the consumer group
``keys.EVENTS_GROUP`` (one pipelined round trip for all partitions), write them in one store
transaction (rows already present are skipped), then XACK them and trim each stream below the
oldest entry not yet archived.  A batch the store refuses stays in memory (and pending in Redis)
and is retried with capped backoff; nothing is acknowledged before it is committed.

Crash safety: an archiver killed after its commit and before its XACK leaves its entries pending;
a restarted archiver with the same id reads them back first, any other one claims them once they
have been idle for ``claim_idle_ms`` (XAUTOCLAIM); writing them again inserts nothing.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from rsched.archive._streams import Batch, EventStreams
from rsched.archive.config import ArchiverConfig, Backoff
from rsched.archive.events import parse_sid
from rsched.archive.job_index import (
    SWEEP_ROWS,
    IndexScan,
    IndexSweep,
    op_job_changes,
    touched_jobs,
)
from rsched.archive.lag import Lag, archive_lag
from rsched.archive.store import DAY_MS, Store, StoreUnavailable, redact
from rsched.archive.stores import open_store
from rsched.core.ids import process_id
from rsched.core.settings import Settings
from rsched.rdb.connect import connect
from rsched.rdb.ops import run
from rsched.rdb.redis_api import Redis, RedisError
from rsched.rdb.setup import (
    UNAVAILABLE,
    Outage,
    check_redis,
    ensure_partitions,
    wait_for_redis_sync,
)

log = logging.getLogger("rsched.archive")

RETENTION_EVERY_S = 3600.0
INDEX_EVERY_S = 0.5  # a step of the job index's scan or sweep (job_index.IndexScan)
SCANNED = "scanned_ms"  # job_index_meta: when a scan last read every job key
LAG_EVERY_S = 10.0
WARN_EVERY_S = 60.0
REPORT_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class BatchResult:
    read: int = 0
    inserted: int = 0
    skipped_old: int = 0
    trimmed: int = 0


class Archiver:
    def __init__(self, r: Redis, store: Store, partitions: int,
                 config: ArchiverConfig | None = None, *, consumer: str | None = None) -> None:
        pool = getattr(r, "connection_pool", None)  # a cluster client checks its nodes'
        if pool is not None and pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the archiver needs a Redis client with decode_responses=False")
        self.r = r
        self.store = store
        self.partitions = partitions
        self.config = config or ArchiverConfig()
        self.consumer = consumer or process_id("a")
        self.streams = EventStreams(r, partitions, self.consumer, self.config.batch,
                                    own_pending=bool(consumer))
        self.backoff = Backoff(self.config.backoff_base_ms, self.config.backoff_cap_ms)
        self._queue: deque[Batch] = deque()  # read, not yet acknowledged; oldest first
        self.totals: dict[str, int] = defaultdict(int)
        self.last_lag: Lag | None = None
        self._warned_at = 0.0
        self._scan: IndexScan | None = None
        self._sweep = IndexSweep()

    # --- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the consumer group on every events stream (from the first entry ever)."""
        self.streams.setup()

    # --- one batch ---------------------------------------------------------------------------

    def read(self) -> Batch:
        """Take the next batch from Redis, prepare it for the store and queue it; its entries
        stay pending in Redis until acknowledged."""
        batch = self.streams.read()
        self._prepare(batch)
        self.read_jobs(batch)  # while the previous batch commits (run_once)
        self._queue.append(batch)
        return batch

    def _prepare(self, batch: Batch) -> None:
        entries = batch.entries
        cutoff = self._cutoff_ms() if self.config.retention_days else 0
        if batch.oldest_ms() < cutoff:
            entries = [e for e in entries if parse_sid(e[1])[0] >= cutoff]
            batch.skipped_old = len(batch.entries) - len(entries)
        batch.prepared = self.store.prepare(entries)
        batch.touched = touched_jobs(entries)
        batch.entries = []

    def read_jobs(self, batch: Batch) -> None:
        """Read the current state of the jobs the batch names (the job index's rows): after
        the batch's events were written, before it is committed (see job_index)."""
        if batch.jobs is None and batch.touched:
            batch.jobs = run(self.r, op_job_changes(batch.touched))
            self.totals["jobs_read"] += len(batch.touched)

    def commit(self, batch: Batch) -> int:
        """Write a prepared batch and its jobs' rows to the store (no acknowledgement);
        returns rows inserted."""
        assert batch.prepared is not None
        self.read_jobs(batch)
        inserted = self.store.commit(batch.prepared, batch.jobs)
        batch.written = True
        self.totals["inserted"] += inserted
        self.totals["duplicates"] += batch.prepared.rows - inserted
        return inserted

    def run_once(self) -> BatchResult:
        """Commit the oldest queued batch (read one if none), acknowledge it and trim.

        While the store commits (waiting on the database, in a thread), the next batch is read
        from Redis and prepared, so both sides stay busy.  Raises StoreUnavailable with the
        batch still queued.
        """
        if not self._queue:
            self.read()
        batch = self._queue[0]
        if not batch.size:
            self._queue.popleft()
            return BatchResult()
        inserted = 0
        if not batch.written:
            self.read_jobs(batch)  # a claimed batch's; not in the writer: one thread uses Redis
            outcome: list[int | BaseException] = []
            writer = threading.Thread(target=self._commit, args=(batch, outcome), daemon=True)
            writer.start()
            read_error: BaseException | None = None
            try:
                if len(self._queue) == 1 and not self.streams.own_pending:
                    self.read()  # our own pending entries would include the batch in flight
            except BaseException as e:  # noqa: BLE001 - raised after the write is settled
                read_error = e
            writer.join()
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            inserted = outcome[0]
            if read_error is not None:
                raise read_error
        trimmed = self.streams.ack(batch)
        self._queue.popleft()
        self.totals["acked"] += batch.size
        return BatchResult(batch.size, inserted, batch.skipped_old, trimmed)

    def _commit(self, batch: Batch, outcome: list[int | BaseException]) -> None:
        try:
            outcome.append(self.commit(batch))
        except BaseException as e:  # noqa: BLE001 - handed to the reading thread
            outcome.append(e)

    def _cutoff_ms(self) -> int:
        return int(time.time() * 1000) - self.config.retention_days * DAY_MS

    # --- housekeeping ------------------------------------------------------------------------

    def claim_once(self) -> int:
        """Take over entries a dead archiver left pending (idle >= claim_idle_ms) as a batch.

        Runs while busy too (a dead archiver's entries hold back every trim until claimed), but
        not while our own pending entries are being read back, nor while the store fails: two
        stalled archivers would only take each other's batches back and forth.
        """
        if self.streams.own_pending or self.backoff.failures or len(self._queue) > 1:
            return 0
        mine = {sid for b in self._queue for ids in b.ids.values() for sid in ids}
        batch = self.streams.claim(self.config.claim_idle_ms, mine)
        if batch.size:
            log.warning("claimed %d events left unacknowledged by a stopped archiver", batch.size)
            self._prepare(batch)
            self._queue.append(batch)
            self.totals["claimed"] += batch.size
        self.streams.forget_stale_consumers()
        return batch.size

    def retention_once(self) -> int:
        """Drop history older than retention_days (no-op when 0)."""
        if not self.config.retention_days:
            return 0
        dropped = self.store.drop_before(self._cutoff_ms())
        if dropped:
            log.info("retention: dropped %d (%s) older than %d days", dropped,
                     "days" if self.store.dialect == "postgres" else "rows",
                     self.config.retention_days)
        return dropped

    def index_once(self) -> int:
        """One step of the job index's housekeeping: the scan that fills in jobs no event
        named, until it has read every job key once (kept in the store, so once per archive),
        then the sweep that deletes rows of jobs gone from Redis.  Returns rows changed."""
        if self._scan is None and self.store.job_index_mark(SCANNED) is None:
            self._scan = IndexScan()
            log.info("job index: scanning every job key in Redis for jobs no event named yet")
        if self._scan is not None and not self._scan.done:
            added = self.store.add_jobs(run(self.r, self._scan.op_step()))
            self.totals["index_scanned"] += added
            if self._scan.done:
                self.store.set_job_index_mark(SCANNED, int(time.time() * 1000))
                log.info("job index: scan done, %d jobs added", self.totals["index_scanned"])
            return added
        rows = self.store.job_ids_after(self._sweep.after, SWEEP_ROWS)
        gone = run(self.r, self._sweep.op_step(rows)) if rows else []
        dropped = self.store.drop_jobs(gone) if gone else 0
        self.totals["index_swept"] += dropped
        return dropped

    def lag(self) -> Lag:
        """Events waiting in Redis and the oldest one's age (see archive_lag)."""
        self.last_lag = archive_lag(self.r, self.partitions)
        return self.last_lag

    def check_lag(self) -> Lag:
        """Measure lag; warn (at most once a minute) when the backlog passes backlog_warn."""
        lag = self.lag()
        now = time.monotonic()
        if lag.entries >= self.config.backlog_warn and now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("archive backlog: %d events wait in Redis (oldest %.1f s); threshold %d",
                        lag.entries, lag.seconds, self.config.backlog_warn)
        return lag

    # --- loop --------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; survives store and Redis outages."""
        log.info("archiver %s started: %d partitions -> %s", self.consumer, self.partitions,
                 self.store.dialect)
        ready = False
        next_claim = next_retention = next_lag = next_index = 0.0
        next_report, reported = time.monotonic() + REPORT_EVERY_S, 0
        outage = Outage(log)
        while not stop.is_set():
            now = time.monotonic()
            try:
                if not ready:
                    self.setup()
                    self.store.connect()  # applies migrations
                    ready = True
                if now >= next_lag:
                    next_lag = now + LAG_EVERY_S
                    lag = self.check_lag()
                    if now >= next_report:
                        done = self.totals["acked"] - reported
                        log.info("archived %d events in the last %.0f s; %d wait in Redis "
                                 "(oldest %.1f s)", done, REPORT_EVERY_S + now - next_report,
                                 lag.entries, lag.seconds)
                        next_report, reported = now + REPORT_EVERY_S, self.totals["acked"]
                if now >= next_claim:
                    next_claim = now + max(self.config.claim_idle_ms / 2000, 1.0)
                    self.claim_once()
                res = self.run_once()
                if now >= next_index:
                    next_index = now + INDEX_EVERY_S
                    self.index_once()
                if now >= next_retention:
                    next_retention = now + RETENTION_EVERY_S
                    self.retention_once()
            except StoreUnavailable as e:
                self._store_down(stop, e)
                continue
            except UNAVAILABLE as e:
                outage.down(e)
                stop.wait(1.0)
                continue
            except RedisError as e:
                if "NOGROUP" in str(e):
                    ready = False  # Redis lost the group (restart without AOF): create it again
                else:
                    log.exception("archive round failed: %s", e)
                stop.wait(1.0)
                continue
            except Exception as e:  # noqa: BLE001 - a bug must not stop archiving for good
                log.exception("archive round failed: %s", e)
                stop.wait(self.backoff.next_s())
                continue
            self.backoff.reset()
            outage.up()
            if not res.read:
                stop.wait(self.config.poll_ms / 1000)
        log.info("archiver %s stopped: %s", self.consumer, dict(self.totals))

    def _store_down(self, stop: threading.Event, e: StoreUnavailable) -> None:
        delay = self.backoff.next_s()
        try:
            lag = self.check_lag()
            behind = f"{lag.entries} events wait in Redis (oldest {lag.seconds:.1f} s)"
        except RedisError:
            behind = "lag unknown"
        log.warning("archive store unavailable: %s; %s; retry in %.1f s", e, behind, delay)
        stop.wait(delay)


def serve(settings: Settings, config: ArchiverConfig, *, archiver_id: str | None = None) -> None:
    """Run an archiver until SIGINT/SIGTERM."""
    # A batch keeps tens of thousands of small lists alive, and none of them forms a cycle:
    # with the default thresholds the collector rescans them several times per batch, which
    # measured at a quarter of the archiver's CPU.
    gc.set_threshold(50_000, 20, 100)
    r = connect(settings.redis_url, wait=settings.wait_replicas,
                wait_timeout_ms=settings.wait_timeout_ms, socket_timeout=30,
                socket_connect_timeout=5)
    store = open_store(config.url)  # connects later: a bad URL fails here, Redis or not
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    partitions = 0

    def setup() -> None:
        nonlocal partitions
        check_redis(r, settings.allow_unsafe_redis)
        partitions = ensure_partitions(r, settings.initial_partitions, settings.strict_partitions)

    try:
        if not wait_for_redis_sync(setup, settings.redis_url, stop):
            return  # stopped before Redis came up
        log.info("archiving to %s", redact(config.url))
        Archiver(r, store, partitions, config, consumer=archiver_id).run(stop)
    finally:
        store.close()
        r.close()


__all__ = ["Archiver", "ArchiverConfig", "Batch", "BatchResult", "serve"]
