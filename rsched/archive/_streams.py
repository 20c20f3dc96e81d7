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
from rsched.archive.lag import trim_point
from rsched.archive.store import Prepared
from rsched.core import defaults
from rsched.core.errors import NotReplicated
from rsched.core.wire import as_text
from rsched.rdb import keys, scripts
from rsched.rdb.cluster import with_raw_replies
from rsched.rdb.durable import wait_of
from rsched.rdb.redis_api import Redis, ResponseError

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


def _raw_entries(reply: Any) -> list[Any]:
    """[id, [field, value, ...]] pairs of a raw XREADGROUP reply (a RESP3 map or RESP2 list)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (items for _, items in reply)
    return [e for items in streams for e in items]



class EventStreams:
    """One archiver's consumer on every partition's events stream."""

    def __init__(self, r: Redis, partitions: int, consumer: str, batch: int,
                 *, own_pending: bool) -> None:
        self.r = r
        # Same connections, but XREADGROUP replies stay raw lists: redis-py's per-entry dict
        # building would cost more than decoding the events.
        self._raw = with_raw_replies(r, "XREADGROUP")
        self.partitions = partitions
        self.consumer = consumer
        self.batch = batch
        # A restart under the same id reads its own pending entries back first; a fresh random
        # id has none (a dead archiver's entries are claimed after claim_idle_ms instead).
        self.own_pending = set(range(partitions)) if own_pending else set()
        self._per_entry: dict[int, int] = {}  # partition -> events per entry, as last read
        self._claim_cursor: dict[int, str] = {}

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

    def read(self) -> Batch:
        """One pipelined XREADGROUP per partition: our own pending entries first (after a
        restart under the same id), new ones once those are done."""
        batch = Batch()
        todo = list(range(self.partitions))
        wait = wait_of(self.r)
        while todo:
            pipe = scripts.pipeline(self._raw, wait)
            for p in todo:
                start = "0" if p in self.own_pending else ">"
                # Entries may hold up to EVENTS_PER_ENTRY_MAX events: once a partition's reads
                # show such entries, ask for as many as keep the batch near `batch` events.
                per = self._per_entry.get(p, 1)
                pipe.xreadgroup(keys.EVENTS_GROUP, self.consumer, {keys.events(p): start},
                                count=max(1, self.batch // per))
                if wait is not None:
                    pipe.set(keys.replicated_mark(p), self.consumer)
            replies = scripts.executed(self._raw, wait, list(scripts.confirm_last(
                self._raw, pipe, wait).execute(raise_on_error=False)))
            if wait is not None:
                replies = self._confirmed(todo, replies[::2], replies[1::2])
            again = []
            for p, res in zip(todo, replies, strict=True):
                if res is None:
                    continue
                if isinstance(res, Exception):
                    raise res
                entries = _raw_entries(res)
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

    def claim(self, claim_idle_ms: int, mine: set[bytes]) -> Batch:
        """Entries other consumers left pending for claim_idle_ms or more (XAUTOCLAIM), but for
        ``mine`` (already queued here); entries deleted while pending are acknowledged."""
        batch = Batch()
        deleted: dict[int, list[bytes]] = defaultdict(list)
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.execute_command("XAUTOCLAIM", keys.events(p), keys.EVENTS_GROUP, self.consumer,
                                 claim_idle_ms, self._claim_cursor.get(p, "0-0"),
                                 "COUNT", max(1, self.batch // self._per_entry.get(p, 1)))
        for p, res in enumerate(pipe.execute(raise_on_error=False)):
            if isinstance(res, Exception):
                continue  # no group yet: setup() runs again on NOGROUP errors from reads
            self._claim_cursor[p] = as_text(res[0])
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
        return batch

    def forget_stale_consumers(self) -> None:
        """Delete consumers with nothing pending that have been silent for CONSUMER_IDLE_MS."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.xinfo_consumers(keys.events(p), keys.EVENTS_GROUP)
        stale = [(p, c["name"]) for p, res in enumerate(pipe.execute(raise_on_error=False))
                 if not isinstance(res, Exception) for c in res
                 if int(c["pending"]) == 0 and int(c["idle"]) > defaults.CONSUMER_IDLE_MS
                 and as_text(c["name"]) != self.consumer]
        if stale:
            pipe = self.r.pipeline(transaction=False)
            for p, name in stale:
                pipe.xgroup_delconsumer(keys.events(p), keys.EVENTS_GROUP, name)
            pipe.execute(raise_on_error=False)
