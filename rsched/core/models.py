"""Job, Run and Lease as stored in Redis hashes, and the spec a caller schedules a job with.

Times are integer milliseconds since the epoch (UTC) with an ``_ms`` suffix.  Hash values come
back from Redis as bytes; ``from_hash`` turns them into typed fields once, at the edge.
"""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from rsched.core import defaults
from rsched.core.catchup import Gap
from rsched.core.errors import ValidationError
from rsched.core.http_target import HTTP_TYPE
from rsched.core.http_target import unwrap as unwrap_target
from rsched.core.ids import created_ms_of
from rsched.core.layout import JB, OWN, OWN_BYTES, STATUS_DEFAULT, J
from rsched.core.lifecycle import NO_LIFE, Life, life_of
from rsched.core.values import read_json, read_msgpack, reason, unreadable
from rsched.core.wire import as_text


class JobStatus(str, enum.Enum):
    """A job's state: scheduled (waiting for its next occurrence), paused, cancelled (final),
    completed (a one-off job that succeeded, or a recurring one past its last occurrence) or
    dead (a one-off job dead-lettered)."""

    SCHEDULED = "scheduled"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    DEAD = "dead"


class RunState(str, enum.Enum):
    """Where an occurrence is now; attempts end as succeeded|failed|timed_out|abandoned."""

    DISPATCHED = "dispatched"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    ABANDONED = "abandoned"
    DELETED = "deleted"  # a one-off job's own run, deleted from the dead letters
    SKIPPED = "skipped"  # not run: the overlap policy (its error says why)
    BUFFERED = "buffered"  # overlap=bufferOne: waits for the job's active run to end
    CANCELLED = "cancelled"  # overlap=cancelPrevious stopped it for a later occurrence
    WAITING = "waiting"  # held by its limit key's concurrency or rate (core.limits)


class Overlap(str, enum.Enum):
    """Whether a recurring job's occurrence runs while an earlier run of the job is active
    (dispatched, running or waiting for a retry); decided in lua/claim.lua."""

    ALLOW = "allow"  # runs may overlap
    SKIP = "skip"  # the occurrence is recorded as a skipped run
    BUFFER_ONE = "bufferOne"  # one occurrence waits and starts when the active run ends
    CANCEL_PREVIOUS = "cancelPrevious"  # the active run is asked to stop; one waits for that


class BackfillOverlap(str, enum.Enum):
    """A backfill's own overlap policy (Temporal's backfill takes one): the job's four, decided
    against the job's active run as its occurrences are, or bufferAll (the default,
    defaults.BACKFILL_OVERLAP): the backfill's occurrences run one after another, the first
    once the job's active run has ended; decided in lua/backfill.lua."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "bufferOne"
    CANCEL_PREVIOUS = "cancelPrevious"
    BUFFER_ALL = "bufferAll"


class Misfire(str, enum.Enum):
    """What happens to occurrences missed by more than the job's catch-up window (core.catchup)."""

    RUN_ONCE = "run_once"  # the latest of them runs once; the others are recorded as skipped
    SKIP = "skip"  # all of them are recorded as skipped


def _s(v: Any, default: str = "") -> str:
    return default if v is None else as_text(v)


def _i(v: Any, default: int = 0) -> int:
    if v is None or v == b"" or v == "":
        return default
    return int(float(v))


def _updated_ms(g: Callable[[str], Any], status: JobStatus) -> int:
    """A job's updated_ms as stored, 0 for none yet (lua/schedule.lua stores none: until a
    change, it is created_ms).  lua/complete.lua stores none either when a one-off job's own
    run completes it: a completed job was last updated when its own run ended, if that was
    after the stored time (a job completed otherwise has one: claim.lua, resume.lua)."""
    stored = _i(g(J.updated_ms))
    if status is JobStatus.COMPLETED:
        return max(stored, _i(g(OWN.ended_ms)))
    return stored


def _get(h: Mapping[Any, Any], name: str) -> Any:
    v = h.get(name.encode())
    return h.get(name) if v is None else v


PACKED_NONE = msgpack.packb(None)
"""A payload of None as stored (a job without payload): unpack_payload gives None for it."""


def unpack_payload(raw: Any) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else None


# A job's static settings travel as one msgpack array (the job hash's ``spec`` field, built in
# spec.prepare and copied into each stream entry), as Asynq keeps a task's message: one field to
# write and to read instead of ten, which halves the Redis time of scheduling.  Scalars the
# scripts branch on stay separate.
# pack_spec takes these fields in this order and unpack_spec names them; tests/unit/test_wire.py
# holds the two together and against every reader of the unpacked spec.
SPEC_ORDER = ("timeout_ms", "backoff_base_ms", "backoff_cap_ms", "priority", "tz", "misfire",
              "jitter_ms", "idem_key", "run_at_ms", "payload", "catch_up_ms", "overlap",
              "life")
# The order the array stores them in: those a job most often sets first, so that the trailing
# ones holding their default are left out (a one-off job with a runAt and the defaults stores
# its payload only: 20 bytes fewer); ``life`` last, where lua/include/life.lua looks.
SPEC_STORED = ("payload", "run_at_ms", "idem_key", "priority", "timeout_ms", "jitter_ms",
               "backoff_base_ms", "backoff_cap_ms", "tz", "misfire", "catch_up_ms", "overlap",
               "life")
# What a left-out element held, in SPEC_STORED order (nil: a SPEC_DEFAULTS field at its default).
# run_at_ms nil: the time of the job's first occurrence (a one-off job's runAt is, and the job
# hash holds it: Job.from_hash), 0: none (a one-off job due at once), so a runAt costs nothing.
_LEFT_OUT: tuple[Any, ...] = (b"", None, "", 0, None, 0, None, None, None, None, None, "", None)
_EMPTY_SPEC = dict(zip(SPEC_STORED, _LEFT_OUT, strict=True))
SPEC_WITH_LIFE = 0x90 + len(SPEC_STORED)
"""A spec's first byte (msgpack fixarray header) when it holds ``life``: one without limits
leaves it out, so its array is shorter (lua/include/life.lua tests this byte)."""


class _Packer(threading.local):
    """A packer per thread (one is not safe to share): msgpack.packb builds a Packer, with a
    1 MiB buffer, on every call, which was a third of the cost of packing a job's spec."""

    def __init__(self) -> None:
        self.pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack


packer = _Packer()


# Settings stored as msgpack's nil (one byte) when they hold their default: 23 bytes fewer for a
# job with the defaults, which keeps a small payload's spec under Redis's hash-max-listpack-value
# (64 by default), so its job hash stays a listpack, half the memory per job
# (docs/performance.md).
SPEC_DEFAULTS = {"timeout_ms": defaults.TIMEOUT_MS, "backoff_base_ms": defaults.BACKOFF_BASE_MS,
                 "backoff_cap_ms": defaults.BACKOFF_CAP_MS, "tz": defaults.TZ,
                 "misfire": "run_once", "catch_up_ms": defaults.CATCH_UP_WINDOW_MS}
_D = SPEC_DEFAULTS
_TIMEOUT, _BASE, _CAP, _TZ, _MISFIRE, _CATCH_UP = (
    _D["timeout_ms"], _D["backoff_base_ms"], _D["backoff_cap_ms"], _D["tz"], _D["misfire"],
    _D["catch_up_ms"])


def pack_spec(timeout_ms: int, backoff_base_ms: int, backoff_cap_ms: int, priority: int,
              tz: str, misfire: str, jitter_ms: int, idem_key: str, run_at_ms: int | None,
              payload: bytes, catch_up_ms: int, overlap: str, life: str | None) -> bytes:
    """The job hash's spec field: the values as one array in SPEC_STORED order (``payload``
    packed already, ``idem_key`` '' when absent, ``run_at_ms`` as _LEFT_OUT says,
    SPEC_DEFAULTS' fields nil when they hold the default, ``life`` None without limits), the
    trailing ones that hold what _LEFT_OUT says left out (the payload is always stored)."""
    if (life is None and overlap == "" and priority == 0 and jitter_ms == 0 and idem_key == ""
            and priority.__class__ is int and jitter_ms.__class__ is int
            and idem_key.__class__ is str and overlap.__class__ is str
            and timeout_ms == _TIMEOUT and backoff_base_ms == _BASE and backoff_cap_ms == _CAP
            and tz == _TZ and misfire == _MISFIRE and catch_up_ms == _CATCH_UP):
        # Every setting after run_at_ms left out (a job with the defaults: most of a batch),
        # what the loop below comes to, without its 13-element list and 11 steps.
        return pack_default_spec(payload, run_at_ms)
    a = [payload, run_at_ms, idem_key, priority,
         None if timeout_ms == _D["timeout_ms"] else timeout_ms, jitter_ms,
         None if backoff_base_ms == _D["backoff_base_ms"] else backoff_base_ms,
         None if backoff_cap_ms == _D["backoff_cap_ms"] else backoff_cap_ms,
         None if tz == _D["tz"] else tz, None if misfire == _D["misfire"] else misfire,
         None if catch_up_ms == _D["catch_up_ms"] else catch_up_ms, overlap, life]
    n = len(a)
    while n > 1 and a[n - 1] == _LEFT_OUT[n - 1] and type(a[n - 1]) is type(_LEFT_OUT[n - 1]):
        n -= 1
    return packer.pack(a[:n] if n < len(a) else a)


def pack_default_spec(payload: bytes, run_at_ms: int | None) -> bytes:
    """pack_spec's bytes for a spec whose other settings all hold their defaults (SPEC_DEFAULTS,
    and no priority, jitter, key, overlap or limits): those trailing elements are left out, so
    the array is [payload, run_at_ms], or [payload] for a run_at_ms of None (left out too)."""
    return packer.pack([payload] if run_at_ms is None else [payload, run_at_ms])


def with_run_at(raw: bytes, run_at_ms: int) -> bytes:
    """A spec ``raw`` with its ``run_at_ms`` stored: a job whose first occurrence ran already
    and is rescheduled (service.scheduling.op_update) has another runAt than that one's time."""
    sp = unpack_spec(raw)
    sp["run_at_ms"] = run_at_ms
    return pack_spec(**{name: sp[name] for name in SPEC_ORDER})


def unpack_spec(raw: Any) -> dict[str, Any]:
    """A spec field as a dict keyed by SPEC_ORDER's names ({} for none), defaults filled in."""
    if not raw:
        return {}
    sp = _EMPTY_SPEC.copy()
    sp.update(zip(SPEC_STORED, msgpack.unpackb(raw, raw=False), strict=False))
    for name, value in _D.items():
        if sp.get(name) is None:
            sp[name] = value
    return sp


@dataclass(slots=True)
class Job:
    """A job as stored: its type, payload, schedule (``run_at_ms`` or ``cron`` in ``tz``), policies
    and state; times are epoch ms.  What Client.schedule and Client.get return."""

    id: str
    type: str
    queue: str
    payload: Any
    status: JobStatus
    run_at_ms: int | None
    cron: str | None
    tz: str
    next_ms: int | None
    max_attempts: int
    backoff_base_ms: int
    backoff_cap_ms: int
    priority: int
    timeout_ms: int
    idempotency_key: str | None
    misfire: Misfire
    jitter_ms: int
    created_ms: int
    updated_ms: int
    last_run_id: str | None
    catch_up_window_ms: int = defaults.CATCH_UP_WINDOW_MS
    last_gap: Gap | None = None  # the latest occurrences skipped together (lua/claim.lua)
    overlap: Overlap = Overlap.ALLOW
    version: int = 1  # 1 + changes by update, pause, resume and cancel (If-Match compares it)
    life: Life = NO_LIFE  # startAt, endAt, maxRuns, pauseAfterFailures, startDeadlineSeconds
    runs: int = 0  # runs started while the job had a maxRuns (lua/claim.lua counts them)
    fail_streak: int = 0  # consecutive dead-lettered occurrences (lua/include/life.lua)
    paused: Control | None = None  # the latest pause: who, when, note, reason
    resumed: Control | None = None  # the latest resume
    limit_key: str | None = None  # its runs count against this key's limit (core.limits)
    target: dict[str, Any] | None = None  # type http: the URL it calls (core.http_target),
    # stored inside the payload
    deduplicated: bool = False  # never stored: a create's answer, True when a dedup window
    # answered it with this existing job (docs/dedup.md)

    @property
    def remaining_runs(self) -> int | None:
        """Runs left before the job completes (None: no maxRuns)."""
        return max(self.life.max_runs - self.runs, 0) if self.life.max_runs else None

    @property
    def partition(self) -> int:
        """The partition the job lives in, read off its id."""
        return partition_of(self.id)

    @classmethod
    def from_hash(cls, h: Mapping[Any, Any], job_id: str) -> Job:
        """The job ``job_id`` from its hash (which holds no id: its key does)."""
        g = lambda n: _get(h, n)  # noqa: E731
        payload: Any = None
        try:
            sp = unpack_spec(g(J.spec))
        except Exception as e:  # noqa: BLE001 - the job stays readable, settings at defaults
            sp = {}
            payload = unreadable(f"job {job_id} spec", "not a valid spec: " + reason(e))
        raw = sp.get("payload")
        if raw:
            payload = read_msgpack(raw, f"job {job_id} payload")
        target = None
        jtype = _s(g(J.type))
        if jtype == HTTP_TYPE:
            target, payload = unwrap_target(payload)
        # Stored for a keyed id only: a random id's stamp is its creation time.
        created = _i(g(J.created_ms)) or created_ms_of(job_id) or 0
        status = JobStatus(_s(g(J.status), STATUS_DEFAULT))
        cron = _s(g(J.cron)) or None
        next_ms = _i(g(J.next_ms)) or None
        run_at = sp.get("run_at_ms")
        if run_at is None and cron is None:  # the first occurrence's time (_LEFT_OUT): its
            # next_ms until dispatched (cancel.lua keeps it), then its own run's
            own = _s(g(J.own_run))
            run_at = next_ms or (int(own.rpartition("@")[2]) if own else None)
        return cls(
            id=job_id,
            type=jtype,
            queue=_s(g(J.queue), defaults.QUEUE),
            payload=payload,
            status=status,
            run_at_ms=run_at or None,
            cron=cron,
            tz=sp.get("tz") or defaults.TZ,
            next_ms=None if status is JobStatus.CANCELLED else next_ms,
            max_attempts=_i(g(J.max_attempts), defaults.MAX_ATTEMPTS),  # absent: the default
            backoff_base_ms=sp.get("backoff_base_ms", defaults.BACKOFF_BASE_MS),
            backoff_cap_ms=sp.get("backoff_cap_ms", defaults.BACKOFF_CAP_MS),
            priority=sp.get("priority", defaults.PRIORITY),
            timeout_ms=sp.get("timeout_ms", defaults.TIMEOUT_MS),
            idempotency_key=sp.get("idem_key") or None,
            misfire=Misfire(sp.get("misfire") or "run_once"),
            jitter_ms=sp.get("jitter_ms", defaults.JITTER_MS),
            created_ms=created,
            updated_ms=_updated_ms(g, status) or created,
            # Absent after the own run's dispatch (lua/claim.lua): that run is the last.
            last_run_id=_s(g(J.last_run_id)) or _s(g(J.own_run)) or None,
            catch_up_window_ms=sp.get("catch_up_ms", defaults.CATCH_UP_WINDOW_MS),
            last_gap=gap_of(_s(g("gap"))),
            overlap=Overlap(sp.get("overlap") or "allow"),
            version=_i(g("version"), 1),
            life=life_of(sp.get("life")),
            runs=_i(g("runs")),
            fail_streak=_i(g("fails")),
            paused=Control.of(h, "paused"),
            resumed=Control.of(h, "resumed"),
            limit_key=_s(g(J.limit_key)) or None,
            target=target,
        )


@dataclass(frozen=True, slots=True)
class Control:
    """Who paused or resumed a job, when, with what note; ``reason`` when rsched paused it
    (pauseAfterFailures).  Job-hash fields <what>_ms, <what>_by, <what>_note, <what>_reason,
    written by lua/pause.lua, lua/resume.lua and lua/include/life.lua."""

    at_ms: int
    by: str
    note: str | None
    reason: str | None

    @classmethod
    def of(cls, h: Mapping[Any, Any], what: str) -> Control | None:
        at = _i(_get(h, what + "_ms"))
        if not at:
            return None
        return cls(at, _s(_get(h, what + "_by")), _s(_get(h, what + "_note")) or None,
                   _s(_get(h, what + "_reason")) or None)


def gap_of(text: str) -> Gap | None:
    """The job hash's ``gap`` field, 'count first_ms last_ms exact' (lua/claim.lua), or None."""
    if not text:
        return None
    count, first, last, exact = text.split()
    return Gap(int(count), int(first), int(last), exact == "1")


def gap_text(gap: Gap) -> str:
    """A gap as lua/claim.lua stores it in the job hash (gap_of reads it back)."""
    return f"{gap.size} {gap.first_ms} {gap.last_ms} {int(gap.exact)}"


@dataclass(frozen=True, slots=True)
class Run:
    """One occurrence of a job (id ``<job id>@<scheduled ms>``) and its current attempt."""

    id: str
    job_id: str
    type: str
    queue: str
    sched_ms: int
    attempt: int
    state: RunState
    worker: str | None
    fence: int
    dispatched_ms: int | None
    started_ms: int | None
    ended_ms: int | None
    duration_ms: int | None
    error: str | None
    result: Any
    job_version: int | None = None  # the job's version at dispatch (None: a one-off's own run)
    waiting_for: str | None = None  # state 'waiting': the limit definition that holds it
    progress: Any = None  # the handler's last ctx.progress: {"value", "message", "at"} (ms)

    @classmethod
    def from_hash(cls, h: Mapping[Any, Any], run_id: str) -> Run:
        """``run_id`` (``<job id>@<scheduled ms>``) names the run: the claim script leaves the
        id, job id and scheduled time out of the hash it creates."""
        g = lambda n: _get(h, n)  # noqa: E731
        res = g("result")
        job_id, _, sched = run_id.rpartition("@")
        return cls(
            id=run_id,
            job_id=job_id,
            type=_s(g("type")),
            queue=_s(g("queue")),
            sched_ms=_i(sched),
            attempt=_i(g("attempt")),
            state=RunState(_s(g("state"))),
            worker=_s(g("worker")) or None,
            fence=_i(g("fence")),
            dispatched_ms=_i(g("dispatched_ms")) or None,
            started_ms=_i(g("started_ms")) or None,
            ended_ms=_i(g("ended_ms")) or None,
            duration_ms=_i(g("duration_ms")) if g("duration_ms") is not None else None,
            error=_s(g("error")) or None,
            result=read_json(res, f"run {run_id} result") if res else None,
            job_version=_i(g("v")) or None,
            waiting_for=_s(g("waiting")) or None,
            progress=read_json(pg, f"run {run_id} progress") if (pg := g("progress")) else None,
        )


def run_fields(run_id: str, run_hash: Mapping[bytes, bytes],
               job_hash: Mapping[bytes, bytes]) -> Mapping[bytes, bytes] | None:
    """The fields of run ``run_id`` given its run hash and its job's hash (None: no such run).

    A one-off job's own run (the job's ``own_run``) keeps its fields in the job hash, under
    core.layout's OWN names (see lua/include/util.lua); its type and queue are the job's.  Other
    runs have a hash of their own."""
    if job_hash.get(JB.own_run) != run_id.encode():
        return run_hash or None
    out = {OWN_BYTES[k]: v for k, v in job_hash.items() if k in OWN_BYTES}
    out[b"type"] = job_hash.get(JB.type, b"")
    out[b"queue"] = job_hash.get(JB.queue) or defaults.QUEUE.encode()  # absent: the default
    return out


@dataclass(frozen=True, slots=True)
class Attempt:
    """One finished attempt of a run, as kept in the job's bounded history list."""

    run_id: str
    attempt: int
    status: str  # succeeded | failed | timed_out | abandoned
    worker: str | None
    sched_ms: int | None
    started_ms: int | None
    ended_ms: int | None
    duration_ms: int | None
    error: str | None = None
    result: Any = None
    dead_lettered: bool = False  # the run's newest attempt, and the run is a dead letter now

    @classmethod
    def from_json(cls, raw: bytes | str) -> Attempt:
        """An attempt from its JSON record in the history list."""
        d = json.loads(raw)
        res = d.get("result")
        return cls(
            run_id=d["run"], attempt=int(d["attempt"]), status=d["status"],
            worker=d.get("worker"), sched_ms=d.get("sched_ms"), started_ms=d.get("started_ms"),
            ended_ms=d.get("ended_ms"), duration_ms=d.get("duration_ms"), error=d.get("error"),
            result=read_json(res, f"run {d['run']} result") if res else None,
        )


@dataclass(frozen=True, slots=True)
class Lease:
    partition: int
    owner: str | None
    expires_ms: int
    fence: int


@dataclass(slots=True)
class DeadLetter:
    run: Run
    dead_ms: int
    extra: dict[str, Any] = field(default_factory=dict)


def partition_of(job_id: str) -> int:
    """Job ids start with their partition number (``7-P7mw...``): no lookup needed."""
    head, sep, _ = job_id.partition("-")
    if not sep or not head.isdigit():
        raise ValidationError("id", f"not an rsched job id: {job_id!r}")
    return int(head)


def job_of_run(run_id: str) -> str:
    """Run ids are ``<job id>@<scheduled ms>``."""
    return run_id.rsplit("@", 1)[0]


class Listed(NamedTuple):
    """What the job index keeps of a job (rsched.archive.job_index), as ``Job.from_hash``
    would read it; ``idempotency_key`` is None when the hash read held no spec."""

    type: str
    queue: str
    status: str
    next_ms: int | None
    created_ms: int
    updated_ms: int
    last_run_id: str | None
    idempotency_key: str | None


def listed(h: Mapping[bytes, Any], job_id: str) -> Listed:
    """``Listed`` from a raw (bytes-keyed) job hash, without building a Job: the archiver
    reads it for every job each batch of events names."""
    g = lambda n: h.get(n.encode())  # noqa: E731
    status = _s(g(J.status), STATUS_DEFAULT)
    created = _i(g(J.created_ms)) or created_ms_of(job_id) or 0
    key = None
    if g(J.spec):
        try:
            key = unpack_spec(g(J.spec)).get("idem_key") or None
        except Exception:  # noqa: BLE001 - as from_hash: the job stays listed, without its key
            key = None
    return Listed(
        _s(g(J.type)), _s(g(J.queue), defaults.QUEUE), status,
        None if status == JobStatus.CANCELLED.value else (_i(g(J.next_ms)) or None),
        created, _updated_ms(g, JobStatus(status)) or created,
        _s(g(J.last_run_id)) or _s(g(J.own_run)) or None, key)
