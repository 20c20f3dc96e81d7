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
import os
import signal
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from rsched.archive.config import ArchiverConfig, Backoff
from rsched.archive.events import Entry, expand, expand_flat, parse_sid
from rsched.archive.lag import Lag, archive_lag, trim_point
from rsched.archive.store import DAY_MS, Prepared, Store, StoreUnavailable, redact
from rsched.archive.stores import open_store
from rsched.core.ids import ulid
from rsched.core.settings import Settings
from rsched.rdb import keys
from rsched.rdb.setup import UNAVAILABLE, check_redis, ensure_partitions, wait_for_redis_sync

log = logging.getLogger("rsched.archive")

STALE_CONSUMER_MS = 3_600_000  # forget a consumer with nothing pending after an hour of silence
RETENTION_EVERY_S = 3600.0
LAG_EVERY_S = 10.0
WARN_EVERY_S = 60.0
REPORT_EVERY_S = 60.0


@dataclass(slots=True)
class Batch:
    """Entries taken from Redis and not yet acknowledged.

    ``entries`` (still in the stream) become ``prepared`` for the store, and are then dropped:
    the raw entries of a 32,000-event batch take tens of MB, its COPY data a few.
    """

    entries: list[Entry] = field(default_factory=list)
    ids: dict[int, list[bytes]] = field(default_factory=lambda: defaultdict(list))  # to ack
    prepared: Prepared | None = None
    skipped_old: int = 0  # older than the retention: acknowledged, never written
    written: bool = False

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.ids.values())

    def add(self, part: int, sid: bytes, fields_: dict[bytes, bytes] | None) -> None:
        self.ids[part].append(sid)
        if fields_:  # None: the entry was deleted from the stream while pending; just ack it
            self.entries += [(part, esid, [x for kv in ev.items() for x in kv])
                             for esid, ev in expand(sid, fields_)]

    def oldest_ms(self) -> int:
        """Entry ids ascend within a partition's part of a batch: the oldest is a first one."""
        return min((parse_sid(ids[0])[0] for ids in self.ids.values() if ids), default=0)


@dataclass(frozen=True, slots=True)
class BatchResult:
    read: int = 0
    inserted: int = 0
    skipped_old: int = 0
    trimmed: int = 0


def _raw_entries(reply: Any) -> list[Any]:
    """[id, [field, value, ...]] pairs of a raw XREADGROUP reply (a RESP3 map or RESP2 list)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (items for _, items in reply)
    return [e for items in streams for e in items]


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Archiver:
    def __init__(self, r: Redis, store: Store, partitions: int,
                 config: ArchiverConfig | None = None, *, consumer: str | None = None) -> None:
        if r.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the archiver needs a Redis client with decode_responses=False")
        self.r = r
        # Same connections, but XREADGROUP replies stay raw lists: redis-py's per-entry dict
        # building would cost more than decoding the events.
        self._raw = Redis(connection_pool=r.connection_pool)
        self._raw.set_response_callback("XREADGROUP", lambda response, **_: response)
        self.store = store
        self.partitions = partitions
        self.config = config or ArchiverConfig()
        self.consumer = consumer or f"a-{socket.gethostname()}-{os.getpid()}-{ulid()[-6:]}"
        self.backoff = Backoff(self.config.backoff_base_ms, self.config.backoff_cap_ms)
        self._queue: deque[Batch] = deque()  # read, not yet acknowledged; oldest first
        # A restart under the same id reads its own pending entries back first; a fresh random
        # id has none (a dead archiver's entries are claimed after claim_idle_ms instead).
        self._own_pending = set(range(partitions)) if consumer else set()
        self._per_entry: dict[int, int] = {}  # partition -> events per entry, as last read
        self._claim_cursor: dict[int, str] = {}
        self.totals: dict[str, int] = defaultdict(int)
        self.last_lag: Lag | None = None
        self._warned_at = 0.0

    # --- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the consumer group on every events stream (from the first entry ever)."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.xgroup_create(keys.events(p), keys.EVENTS_GROUP, id="0", mkstream=True)
        for res in pipe.execute(raise_on_error=False):
            if isinstance(res, ResponseError) and "BUSYGROUP" not in str(res):
                raise res
            if isinstance(res, Exception) and not isinstance(res, ResponseError):
                raise res

    # --- one batch ---------------------------------------------------------------------------

    def read(self) -> Batch:
        """Take the next batch from Redis, prepare it for the store and queue it; its entries
        stay pending in Redis until acknowledged."""
        batch = self._read()
        self._prepare(batch)
        self._queue.append(batch)
        return batch

    def _prepare(self, batch: Batch) -> None:
        entries = batch.entries
        cutoff = self._cutoff_ms() if self.config.retention_days else 0
        if batch.oldest_ms() < cutoff:
            entries = [e for e in entries if parse_sid(e[1])[0] >= cutoff]
            batch.skipped_old = len(batch.entries) - len(entries)
        batch.prepared = self.store.prepare(entries)
        batch.entries = []

    def commit(self, batch: Batch) -> int:
        """Write a prepared batch to the store (no acknowledgement); returns rows inserted."""
        assert batch.prepared is not None
        inserted = self.store.commit(batch.prepared)
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
            outcome: list[int | BaseException] = []
            writer = threading.Thread(target=self._commit, args=(batch, outcome), daemon=True)
            writer.start()
            read_error: BaseException | None = None
            try:
                if len(self._queue) == 1 and not self._own_pending:
                    self.read()  # our own pending entries would include the batch in flight
            except BaseException as e:  # noqa: BLE001 - raised after the write is settled
                read_error = e
            writer.join()
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            inserted = outcome[0]
            if read_error is not None:
                raise read_error
        trimmed = self._ack(batch)
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

    def _read(self) -> Batch:
        """One pipelined XREADGROUP per partition: our own pending entries first (after a
        restart under the same id), new ones once those are done."""
        batch = Batch()
        todo = list(range(self.partitions))
        while todo:
            pipe = self._raw.pipeline(transaction=False)
            for p in todo:
                start = "0" if p in self._own_pending else ">"
                # Entries may hold up to EVENTS_PER_ENTRY_MAX events: once a partition's reads
                # show such entries, ask for as many as keep the batch near `batch` events.
                per = self._per_entry.get(p, 1)
                pipe.xreadgroup(keys.EVENTS_GROUP, self.consumer, {keys.events(p): start},
                                count=max(1, self.config.batch // per))
            again = []
            for p, res in zip(todo, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(res, Exception):
                    raise res
                entries = _raw_entries(res)
                if p in self._own_pending and not entries:
                    self._own_pending.discard(p)
                    again.append(p)
                if not entries:
                    continue
                ids, keep = batch.ids[p], batch.entries  # inline: once per event
                most = 1
                for sid, flat in entries:
                    ids.append(sid)
                    if flat:  # None: deleted from the stream while pending; just ack it
                        if b"n" in flat[::2]:  # several events in one entry
                            events = expand_flat(sid, flat)
                            most = max(most, len(events))
                            keep += [(p, esid, ev) for esid, ev in events]
                        else:
                            keep.append((p, sid, flat))
                # The largest entry of this read, or half the last estimate: a stream of single
                # events is soon read `batch` entries at a time again.
                self._per_entry[p] = max(most, self._per_entry.get(p, 1) // 2)
            todo = again
        return batch

    def _ack(self, batch: Batch) -> int:
        """XACK the batch, then trim each touched stream below its oldest unarchived entry."""
        parts = sorted(p for p, ids in batch.ids.items() if ids)
        pipe = self.r.pipeline(transaction=False)
        for p in parts:
            pipe.xack(keys.events(p), keys.EVENTS_GROUP, *batch.ids[p])
        for p in parts:  # group (last-delivered) strictly before XPENDING: see trim_point
            pipe.xinfo_groups(keys.events(p))
            pipe.xpending(keys.events(p), keys.EVENTS_GROUP)
        res = pipe.execute(raise_on_error=False)
        for r in res[: len(parts)]:
            if isinstance(r, Exception):
                raise r
        points = [(p, trim_point(res[len(parts) + 2 * i], res[len(parts) + 2 * i + 1]))
                  for i, p in enumerate(parts)]
        pipe = self.r.pipeline(transaction=False)
        trims = [(p, point) for p, point in points if point]
        for p, point in trims:
            pipe.xtrim(keys.events(p), minid=point, approximate=False)
        return sum(int(n) for n in pipe.execute(raise_on_error=False) if isinstance(n, int))

    # --- housekeeping ------------------------------------------------------------------------

    def claim_once(self) -> int:
        """Take over entries a dead archiver left pending (idle >= claim_idle_ms) as a batch.

        Runs while busy too (a dead archiver's entries hold back every trim until claimed), but
        not while our own pending entries are being read back, nor while the store fails: two
        stalled archivers would only take each other's batches back and forth.
        """
        if self._own_pending or self.backoff.failures or len(self._queue) > 1:
            return 0
        mine = {sid for b in self._queue for ids in b.ids.values() for sid in ids}
        batch = Batch()
        deleted: dict[int, list[bytes]] = defaultdict(list)
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.execute_command("XAUTOCLAIM", keys.events(p), keys.EVENTS_GROUP, self.consumer,
                                 self.config.claim_idle_ms, self._claim_cursor.get(p, "0-0"),
                                 "COUNT", max(1, self.config.batch // self._per_entry.get(p, 1)))
        for p, res in enumerate(pipe.execute(raise_on_error=False)):
            if isinstance(res, Exception):
                continue  # no group yet: setup() runs again on NOGROUP errors from reads
            self._claim_cursor[p] = _s(res[0])
            for sid, fields_ in res[1]:
                if fields_ is not None and sid not in mine:
                    batch.add(p, sid, fields_)
            if len(res) > 2 and res[2]:
                deleted[p] += list(res[2])
        if deleted:
            pipe = self.r.pipeline(transaction=False)
            for p, ids in deleted.items():
                pipe.xack(keys.events(p), keys.EVENTS_GROUP, *ids)
            pipe.execute(raise_on_error=False)
        if batch.size:
            log.warning("claimed %d events left unacknowledged by a stopped archiver", batch.size)
            self._prepare(batch)
            self._queue.append(batch)
            self.totals["claimed"] += batch.size
        self._forget_stale_consumers()
        return batch.size

    def _forget_stale_consumers(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.xinfo_consumers(keys.events(p), keys.EVENTS_GROUP)
        stale = [(p, c["name"]) for p, res in enumerate(pipe.execute(raise_on_error=False))
                 if not isinstance(res, Exception) for c in res
                 if int(c["pending"]) == 0 and int(c["idle"]) > STALE_CONSUMER_MS
                 and _s(c["name"]) != self.consumer]
        if stale:
            pipe = self.r.pipeline(transaction=False)
            for p, name in stale:
                pipe.xgroup_delconsumer(keys.events(p), keys.EVENTS_GROUP, name)
            pipe.execute(raise_on_error=False)

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
        next_claim = next_retention = next_lag = 0.0
        next_report, reported = time.monotonic() + REPORT_EVERY_S, 0
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
                if now >= next_retention:
                    next_retention = now + RETENTION_EVERY_S
                    self.retention_once()
            except StoreUnavailable as e:
                self._store_down(stop, e)
                continue
            except UNAVAILABLE as e:
                log.warning("redis unavailable: %s; retrying", e)
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
    r = Redis.from_url(settings.redis_url, socket_timeout=30, socket_connect_timeout=5)
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
