"""One archived event: a Redis events-stream entry as a typed row, the same for every store.

The row's identity is (sid_ms, sid_seq, part): the stream entry id within its partition.  Redis
assigns it once, so the same entry delivered twice (an archiver killed between its commit and its
XACK) is the same row, and ``ON CONFLICT DO NOTHING`` keeps exactly one copy.

Decoding never raises: a malformed field becomes NULL and its raw text is kept in ``extra``, so one
bad entry can never stall the archive (a row a store rejects would be retried forever).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from rsched.core import wire
from rsched.core.wire import parse_sid

COLUMNS = (
    "sid_ms", "sid_seq", "part", "event", "job_id", "run_id", "attempt", "ts_ms", "worker",
    "duration_ms", "job_type", "queue", "sched_ms", "error", "result", "fence", "retry_at_ms",
    "extra", "started_ms",
)  # fmt: skip
"""Column order shared by the migrations, COPY, INSERT and every read query."""

# Stream fields with a column (see CONTEXT: e, j, r, a, t, w, d, ty, q, s, err, res, f; 'at' is
# the retry time of retry_scheduled; 'st' the start time an outcome event carries when its run
# started and finished within one report, with no 'started' event of its own).  's' (sched ms)
# is derived from the run id when there is one.
KNOWN = frozenset(wire.EV_FIELDS)
_INT64 = 2**63 - 1

# Outcome events of an attempt, strongest first: an attempt that failed and whose run was later
# abandoned (job cancelled while waiting for its retry) failed.  'deferred': its handler raised
# RateLimited, the attempt given back (it runs again under the same number).
OUTCOMES = ("succeeded", "cancelled", "timed_out", "failed", "abandoned", "deferred")
FAILURES = ("timed_out", "failed", "abandoned")
# Events that mark a run, not one of its attempts (and a stale report, which changed nothing).
RUN_MARKERS = frozenset({"triggered", "replayed", "fenced"})


Entry = tuple[int, bytes, list[bytes]]
"""A stream entry as read: (partition, entry id, [field, value, field, value, ...])."""


class EventRow(NamedTuple):
    sid_ms: int
    sid_seq: int
    part: int
    event: str
    job_id: str | None
    run_id: str | None
    attempt: int | None
    ts_ms: int | None
    worker: str | None
    duration_ms: int | None
    job_type: str | None
    queue: str | None
    sched_ms: int | None
    error: str | None
    result: str | None
    fence: int | None
    retry_at_ms: int | None
    extra: str | None
    started_ms: int | None = None  # an outcome that also records its run's start (lua/complete.lua)

    @property
    def sid(self) -> str:
        """The stream entry id, ``<ms>-<seq>``."""
        return f"{self.sid_ms}-{self.sid_seq}"


def _text(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "replace")
    return text.replace("\x00", "\ufffd") if b"\x00" in raw else text  # no NUL in PG text


def _int(raw: bytes | None, key: bytes, bad: dict[bytes, bytes]) -> int | None:
    if not raw:
        return None
    try:
        value = int(raw)
        if len(raw) < 19 or -_INT64 <= value <= _INT64:
            return value
    except ValueError:
        pass
    bad[key] = raw
    return None


def sched_of_run(run_id: str) -> int | None:
    """Run ids are ``<job id>@<scheduled ms>``: every event of a run shares this time."""
    _, sep, tail = run_id.rpartition("@")
    return int(tail) if sep and tail.isdigit() and len(tail) < 19 else None


def job_of_event_run(run_id: str | None) -> str | None:
    """Run events leave out the job id ('j') and scheduled time ('s'): both are in the run id."""
    if not run_id:
        return None
    job_id, sep, _ = run_id.rpartition("@")
    return job_id if sep else None


def _n(raw: bytes | None) -> int | None:
    """A stream integer; ValueError for anything that is not one, or beyond 18 digits."""
    return int(raw if len(raw) < 19 else b"?") if raw else None


def _fast(part: int, sid: bytes, f: dict[bytes, bytes]) -> EventRow | None:
    """The common case, inline: known fields, valid UTF-8 without NUL, plain integers.

    None when anything needs care; ``decode`` then takes the careful path.  This runs once per
    archived event, and a Python call per field would double the archiver's CPU per event.
    """
    if not f.keys() <= KNOWN or b"\x00" in b"".join(f.values()):
        return None
    g = f.get
    try:
        ms, _, seq = sid.partition(b"-")
        e, j, r, w, ty, q, err, res = (g(b"e"), g(b"j"), g(b"r"), g(b"w"), g(b"ty"), g(b"q"),
                                       g(b"err"), g(b"res"))
        run_id = r.decode() if r else None
        sched = sched_of_run(run_id) if run_id else None
        job_id = j.decode() if j else job_of_event_run(run_id)
        return EventRow(
            int(ms), int(seq or b"0"), part, e.decode() if e else "", job_id,
            run_id, _n(g(b"a")), _n(g(b"t")), w.decode() if w else None, _n(g(b"d")),
            ty.decode() if ty else None, q.decode() if q else None,
            _n(g(b"s")) if sched is None else sched, err.decode() if err else None,
            res.decode() if res else None, _n(g(b"f")), _n(g(b"at")), None, _n(g(b"st")),
        )
    except (ValueError, UnicodeDecodeError):
        return None


def decode(part: int, sid: bytes | str, f: dict[bytes, bytes]) -> EventRow:
    """Turn one stream entry into a row; unknown or malformed fields go to ``extra`` as JSON."""
    if isinstance(sid, bytes):
        row = _fast(part, sid, f)
        if row is not None:
            return row
    sid_ms, sid_seq = parse_sid(sid)
    g = f.get
    bad: dict[bytes, bytes] = {}
    run_id = _text(g(b"r"))
    sched = sched_of_run(run_id) if run_id else None
    if sched is None:
        sched = _int(g(b"s"), b"s", bad)
    row = EventRow(
        sid_ms, sid_seq, part, _text(g(b"e")) or "", _text(g(b"j")) or job_of_event_run(run_id),
        run_id,
        _int(g(b"a"), b"a", bad), _int(g(b"t"), b"t", bad), _text(g(b"w")),
        _int(g(b"d"), b"d", bad), _text(g(b"ty")), _text(g(b"q")), sched, _text(g(b"err")),
        _text(g(b"res")), _int(g(b"f"), b"f", bad), _int(g(b"at"), b"at", bad), None,
        _int(g(b"st"), b"st", bad),
    )
    unknown = f.keys() - KNOWN
    if unknown or bad:
        extra = {k.decode("utf-8", "replace"): (f[k] or b"").decode("utf-8", "replace")
                 for k in (*unknown, *bad)}
        row = row._replace(extra=json.dumps(extra, sort_keys=True))
    return row


EVENTS_PER_ENTRY_MAX = 100
"""Events one stream entry holds at most (BATCH_MAX in lua/include/util.lua)."""


def _expanded(sid: bytes, f: dict[bytes, bytes]) -> list[tuple[bytes, dict[bytes, bytes]]] | None:
    raw_n = f.get(b"n")
    ms, dash, seq = sid.partition(b"-")
    try:
        n, first = int(raw_n or b""), int(seq)
    except ValueError:
        return None
    if not 1 < n <= 1_000_000 or not dash:
        return None
    sep = n - 1
    common = {k: v for k, v in f.items() if k != b"n" and v.count(b"\n") != sep}
    columns = [(k, v.split(b"\n")) for k, v in f.items() if k != b"n" and k not in common]
    out = []
    for i in range(n):
        ev = dict(common)
        for k, values in columns:
            if values[i]:
                ev[k] = values[i]
        out.append((b"%s-%d" % (ms, first + i), ev))
    return out


def expand(sid: bytes, f: dict[bytes, bytes]) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The events of one stream entry, each with its own id: (event id, fields).

    Scripts append the events of one kind from one call as one entry (``batch_flush`` in
    lua/include/util.lua): 'n' events, shared fields once, and the differing values of a field
    joined by newlines (no such value holds a newline; an empty one is a missing field).  Event
    k (0-based) of entry ``<ms>-<seq>`` is ``<ms>-<seq + k>``: the script reserved those ids with
    XSETID, so the archive's key (the event id) stays unique.  Any other entry is one event.  A
    malformed batch comes back as one event (decode keeps its fields in ``extra``).
    """
    if b"n" not in f:
        return [(sid, f)]
    return _expanded(sid, f) or [(sid, f)]


def expand_flat(sid: bytes, flat: list[bytes]) -> list[tuple[bytes, list[bytes]]]:
    """Same, from the field/value list of a raw (unparsed) stream reply."""
    if b"n" not in flat[::2]:
        return [(sid, flat)]
    events = _expanded(sid, dict(zip(flat[::2], flat[1::2], strict=False)))
    if events is None:
        return [(sid, flat)]
    return [(esid, [x for kv in ev.items() for x in kv]) for esid, ev in events]


def decode_flat(part: int, sid: bytes, flat: list[bytes]) -> EventRow:
    """Same, from the field/value list of a raw (unparsed) stream reply."""
    return decode(part, sid, dict(zip(flat[::2], flat[1::2], strict=True)))


__all__ = ["COLUMNS", "EVENTS_PER_ENTRY_MAX", "Entry", "EventRow", "FAILURES", "KNOWN", "OUTCOMES",
           "RUN_MARKERS",
           "decode", "decode_flat", "expand", "expand_flat", "job_of_event_run", "parse_sid",
           "sched_of_run"]
