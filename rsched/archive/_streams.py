"""The archiver's side of the events streams: its consumer in ``keys.EVENTS_GROUP``.

Reads batches (own pending entries first after a restart under the same id), claims what a
dead archiver left pending, acknowledges and trims.  The archiver (rsched.archive.archiver)
queues, prepares and commits what this reads; nothing here touches the store.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rsched.archive.events import Entry, expand, expand_flat, parse_sid
from rsched.archive.job_index import JobChanges, Touched
from rsched.archive.store import Prepared
from rsched.core import defaults
from rsched.core.errors import NotReplicated
from rsched.rdb import event_streams
from rsched.rdb.redis_api import Redis

log = logging.getLogger("rsched.archive")


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
    touched: dict[str, Touched] = field(default_factory=dict)  # jobs its events name
    jobs: JobChanges | None = None  # their rows, read from Redis before the commit

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


class EventStreams:
    """One archiver's consumer on every partition's events stream."""

    def __init__(self, r: Redis, partitions: int, consumer: str, batch: int,
                 *, own_pending: bool) -> None:
        self.redis = event_streams.Consumer(r, partitions, consumer)
        self.partitions = partitions
        self.consumer = consumer
        self.batch = batch
        # A restart under the same id reads its own pending entries back first; a fresh random
        # id has none (a dead archiver's entries are claimed after claim_idle_ms instead).
        self.own_pending = set(range(partitions)) if own_pending else set()
        self._per_entry: dict[int, int] = {}  # partition -> events per entry, as last read
        self._claim_cursor: dict[int, str] = {}

    def setup(self) -> None:
        """Create the consumer group on every events stream (from its oldest entry); say what
        the streams lost before, while no archiver read them."""
        lost = self.redis.create_groups()
        if lost:
            log.warning("archiver group created now: %d events stream entries trimmed before it "
                        "(RSCHED_EVENTS_KEEP, RSCHED_EVENTS_KEEP_MS bound the streams while no "
                        "archiver reads them) are not archived; the archive starts from the "
                        "oldest entry each stream still holds", lost)

    def read(self) -> Batch:
        """One pipelined XREADGROUP per partition: our own pending entries first (after a
        restart under the same id), new ones once those are done."""
        batch = Batch()
        todo = list(range(self.partitions))
        while todo:
            # Entries may hold up to EVENTS_PER_ENTRY_MAX events: once a partition's reads show
            # such entries, ask for as many as keep the batch near `batch` events.
            replies, marks = self.redis.read([
                (p, "0" if p in self.own_pending else ">",
                 max(1, self.batch // self._per_entry.get(p, 1))) for p in todo])
            if marks is not None:
                replies = self._confirmed(todo, replies, marks)
            again = []
            for p, entries in zip(todo, replies, strict=True):
                if entries is None:
                    continue
                if isinstance(entries, Exception):
                    raise entries
                if p in self.own_pending and not entries:
                    self.own_pending.discard(p)
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

    def _confirmed(self, todo: list[int], reads: list[Any], marks: list[Any]) -> list[Any]:
        """Under the durability setting, store only events a replica has (else a failover could
        leave history of jobs Redis no longer knows): a partition whose read replicas did not
        confirm in time is read again from its pending entries next round (None here)."""
        out: list[Any] = []
        for p, res, mark in zip(todo, reads, marks, strict=True):
            if isinstance(mark, NotReplicated) or isinstance(res, NotReplicated):
                if p not in self.own_pending:
                    log.warning("partition %d: events not confirmed by a replica yet (%s); "
                                "read again before storing", p, mark)
                self.own_pending.add(p)
                out.append(None)
            else:
                out.append(res)
        return out

    def ack(self, batch: Batch) -> int:
        """XACK the batch, then trim each touched stream below its oldest unarchived entry."""
        points = self.redis.ack_and_inspect(batch.ids)
        return self.redis.trim((p, point) for p, point in points if point)

    def claim(self, claim_idle_ms: int, mine: set[bytes]) -> Batch:
        """Entries other consumers left pending for claim_idle_ms or more (XAUTOCLAIM), but for
        ``mine`` (already queued here); entries deleted while pending are acknowledged."""
        batch = Batch()
        deleted: dict[int, list[bytes]] = defaultdict(list)
        claims = [(p, self._claim_cursor.get(p, "0-0"),
                   max(1, self.batch // self._per_entry.get(p, 1)))
                  for p in range(self.partitions)]
        for p, res in enumerate(self.redis.autoclaim(claim_idle_ms, claims)):
            if res is None:
                continue  # no group yet: setup() runs again on NOGROUP errors from reads
            self._claim_cursor[p] = res.cursor
            for sid, fields_ in res.entries:
                if fields_ is not None and sid not in mine:
                    batch.add(p, sid, fields_)
            deleted[p] += res.deleted
        deleted = {p: ids for p, ids in deleted.items() if ids}
        if deleted:
            self.redis.ack(deleted)
        return batch

    def forget_stale_consumers(self) -> None:
        """Delete consumers with nothing pending that have been silent for CONSUMER_IDLE_MS."""
        stale = self.redis.idle_consumers(defaults.CONSUMER_IDLE_MS)
        if stale:
            self.redis.delete_consumers(stale)
