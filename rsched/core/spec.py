"""What a caller asks for when scheduling a job, validated into the fields of the job hash.

Validation happens here, once, for every face (Python, CLI, HTTP): each error names the field as
the HTTP API spells it, so a caller in any language knows what to fix.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, NamedTuple

from rsched.core import defaults
from rsched.core.cron import parse_cron, validate_zone
from rsched.core.errors import PayloadTooLarge, ValidationError
from rsched.core.http_target import HTTP_TYPE, check_target
from rsched.core.http_target import wrap as wrap_target
from rsched.core.layout import J
from rsched.core.lifecycle import NEVER_MS, NO_LIFE, Life, bounded, life_packed
from rsched.core.limits import check_key as check_limit_key
from rsched.core.models import (
    Job,
    JobStatus,
    Misfire,
    Overlap,
    pack_default_spec,
    pack_spec,
    packer,
)
from rsched.core.times import ms_to_iso, to_ms
from rsched.core.values import TOO_DEEP, VALUE_DEPTH, check_depth, shallow_msgpack, too_deep

# ms_to_iso and to_ms are re-exported: rsched.service.preview and the faces import them from here.
__all__ = ["DEDUP_MODES", "KEY_NAME_PATTERN", "QUEUE_PATTERN", "TYPE_PATTERN", "Dedup",
           "JobSpec", "Prepared", "check_dedup", "ms_to_iso", "prepare", "to_ms"]


TYPE_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"  # a job type (the HTTP API's schema says the same)
QUEUE_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
KEY_NAME_PATTERN = r"^[A-Za-z0-9_.:@\- ]{1,64}$"  # an API key's name (checked by the service)
_NAME = re.compile(TYPE_PATTERN)
_QUEUE = re.compile(QUEUE_PATTERN)
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
MAX_BACKOFF_BASE_MS = 86_400_000
MAX_BACKOFF_CAP_MS = 30 * 86_400_000
MAX_PRIORITY = 1000
MAX_JITTER_MS = 86_400_000
MAX_CATCH_UP_MS = 30 * 86_400_000
MAX_RUNS_LIMIT = 1_000_000_000
MAX_PAUSE_AFTER = 1_000_000
MAX_START_DEADLINE_MS = 30 * 86_400_000
MAX_DEDUP_KEY = 200  # characters of a dedup key
MAX_DEDUP_TTL_MS = 30 * 86_400_000
DEDUP_MODES = ("ttl", "untilDone", "debounce")
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant ISO-8601 writes
# (member, its text), read without Enum.value's descriptor on this per-job path.
_MISFIRES = {m.value: (m, m.value) for m in Misfire}
_MISFIRES["runOnce"] = _MISFIRES["run_once"]  # the camelCase spelling the API's fields use
_NO_MISFIRE = (None, "")
# Stored text of each policy: '' for allow, so a one-off job's spec grows by one byte only.
_OVERLAPS = {m.value: (m, "" if m is Overlap.ALLOW else m.value) for m in Overlap}
_STATUS_TEXT = {s: s.value for s in JobStatus}
# A new job's two statuses as constants, not an enum lookup per job.
_SCHEDULED, _PAUSED = JobStatus.SCHEDULED, JobStatus.PAUSED
_RUN_ONCE, _ALLOW = Misfire.RUN_ONCE, Overlap.ALLOW
_MAX_ATTEMPTS = defaults.MAX_ATTEMPTS


def check_names(jtype: Any, queue: Any) -> None:
    if not isinstance(jtype, str) or not _NAME.fullmatch(jtype):
        raise ValidationError("type", "must be 1-128 characters of letters, digits, _ . : -")
    if not isinstance(queue, str) or not _QUEUE.fullmatch(queue):
        raise ValidationError("queue", "must be 1-64 characters of letters, digits, _ . -")
    if type(jtype) is str and type(queue) is str and jtype != HTTP_TYPE:  # http: checked path
        if len(_seen_names) >= 4096:
            _seen_names.clear()
        _seen_names.add((jtype, queue))


_seen_names: set[tuple[str, str]] = set()
"""(type, queue) pairs that passed their patterns: a batch's jobs mostly share both, and a set
lookup costs a fifth of the two regular expressions."""

# The integer settings as prepare reads them: the field's name in errors, and its bounds.
_INT_FIELDS = (
    ("maxAttempts", 1, MAX_ATTEMPTS_LIMIT), ("backoff.baseSeconds", 0, MAX_BACKOFF_BASE_MS),
    ("backoff.capSeconds", 0, MAX_BACKOFF_CAP_MS), ("priority", -MAX_PRIORITY, MAX_PRIORITY),
    ("timeoutSeconds", 1, MAX_TIMEOUT_MS), ("jitterSeconds", 0, MAX_JITTER_MS),
)


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}, got {value}")
    return value


def check_ints(values: tuple[Any, ...]) -> None:
    """The integer settings, in _INT_FIELDS order: each an int in its bounds."""
    for value, (field, lo, hi) in zip(values, _INT_FIELDS, strict=True):
        _int(value, field, lo, hi)


def usual_fast(jtype: Any, queue: Any, max_attempts: Any, base: Any, cap: Any, priority: Any,
               timeout: Any, jitter: Any) -> bool:
    """True only if check_names and check_ints would pass: a (type, queue) seen before and
    plain ints in range: one test instead of eight checks per job (make bench); tests/
    test_client.py compares it with the plain checks."""
    return (type(jtype) is str and type(queue) is str and (jtype, queue) in _seen_names
            and type(max_attempts) is int and 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
            and type(base) is int and 0 <= base <= MAX_BACKOFF_BASE_MS
            and type(cap) is int and 0 <= cap <= MAX_BACKOFF_CAP_MS
            and type(priority) is int and -MAX_PRIORITY <= priority <= MAX_PRIORITY
            and type(timeout) is int and 1 <= timeout <= MAX_TIMEOUT_MS
            and type(jitter) is int and 0 <= jitter <= MAX_JITTER_MS)


@dataclass(frozen=True, slots=True)
class Dedup:
    """A dedup window on create (docs/dedup.md): creates with the same ``key`` within
    ``ttl_ms`` answer one job.  ``mode``: 'ttl' (the first job, for ttl_ms from it),
    'untilDone' (the job until it ends, ttl_ms at most) or 'debounce' (each create within
    ttl_ms of the previous one moves the job to ttl_ms after it, with its payload)."""

    key: str
    ttl_ms: int
    mode: str = defaults.DEDUP_MODE


@dataclass(slots=True)
class JobSpec:
    """A job to schedule: one-off at ``run_at`` (default now) or recurring on ``cron`` in ``tz``."""

    type: str
    payload: Any = None
    run_at: Any = None
    cron: str | None = None
    tz: str | None = None
    queue: str = defaults.QUEUE
    max_attempts: int = defaults.MAX_ATTEMPTS
    backoff_base_ms: int = defaults.BACKOFF_BASE_MS
    backoff_cap_ms: int = defaults.BACKOFF_CAP_MS
    priority: int = defaults.PRIORITY
    timeout_ms: int = defaults.TIMEOUT_MS
    idempotency_key: str | None = None
    misfire: str = Misfire.RUN_ONCE.value
    jitter_ms: int = defaults.JITTER_MS
    paused: bool = False
    catch_up_window_ms: int = defaults.CATCH_UP_WINDOW_MS
    overlap: str = defaults.OVERLAP
    start_at: Any = None  # recurring: no occurrence before it (ISO text, datetime or epoch ms)
    end_at: Any = None  # recurring: no occurrence after it; the job then completes
    max_runs: int | None = None  # recurring: the job completes after this many runs started
    pause_after_failures: int | None = None  # recurring: dead-lettered occurrences in a row
    start_deadline_ms: int | None = None  # one-off: not started by runAt + this: dead letter
    limit_key: str | None = None  # its runs count against this key's limit (core.limits)
    dedup: Dedup | None = None  # a dedup window: placed in its key's partition (check_dedup)
    target: dict[str, Any] | None = None  # an HTTP target (type http): url, method, headers,
    # body, timeoutSeconds, as the API takes it (core.http_target.check_target)


SHARED_FIELDS = (J.type, J.queue, J.status, J.max_attempts, J.cron, J.limit_key)
"""Job-hash fields that the jobs of a batch mostly share: lua/schedule.lua takes them once per
group of jobs with the same values."""
OWN_FIELDS = (J.next_ms, J.spec)
"""Job-hash fields each job has its own value of.  With SHARED_FIELDS, what scheduling writes
(lua/schedule.lua adds created_ms and body_hash for a job with an idempotency key; it leaves
out a shared field that is '', e.g. a one-off job's cron).  No ``id``: the key holds it, and a
random id's stamp is its created_ms (rsched.core.ids.created_ms_of)."""


class Prepared(NamedTuple):
    """A validated spec: the job as it will be stored, the hash values, its due-set position.

    A NamedTuple, not a dataclass: a batch builds one per job, and this is the cheapest record;
    the job-hash values are read off the job when sent rather than kept in more tuples."""

    job: Job  # created_ms/updated_ms: the caller's reading of Redis's clock (a random id's
    # stamp); a keyed job takes the script's
    blob: bytes  # the job hash's spec field
    body_hash: str  # '' without an idempotency key: a random id is never reused
    next_ms: int  # nominal next occurrence
    score: float | int  # due score: next_ms plus the job's deterministic jitter, priority-ordered

    def shared(self) -> tuple[Any, ...]:
        """Job-hash values in SHARED_FIELDS order; '' (not stored) for max_attempts when it is
        the default (the readers fill it in: Job.from_hash, `--!include defaults`) and for a
        one-off job's cron.  schedule.lua leaves out queue and status at their defaults too
        (core.layout): a small job's hash stays within jemalloc's 80-byte class."""
        job = self.job
        attempts = job.max_attempts
        return (job.type, job.queue, _STATUS_TEXT[job.status],
                "" if attempts == _MAX_ATTEMPTS else attempts, job.cron or "",
                job.limit_key or "")

    def own(self) -> tuple[Any, ...]:
        """Job-hash values in OWN_FIELDS order."""
        return (self.next_ms, self.blob)


# A due set orders jobs due in the same millisecond by priority: the score is the due ms minus
# priority/2048.  Priorities span -1000..1000, so the offset stays within +-0.489 and round(score)
# is the due ms again; a score is due once it is <= now + 0.5.  Below 2**42 ms (year 2109) these
# scores are exact doubles, and priority 0 keeps plain integer scores.
PRIORITY_SCALE = 2048


def due_score(due_ms: int, priority: int) -> float | int:
    """Due-set score of an occurrence: earliest first, then highest priority."""
    return due_ms - priority / PRIORITY_SCALE if priority else due_ms


def jitter_offset_ms(job_id: str, nominal_ms: int, jitter_ms: int) -> int:
    """Deterministic jitter in [-jitter, +jitter]: the same occurrence always lands the same."""
    if jitter_ms <= 0:
        return 0
    h = hashlib.blake2b(f"{job_id}@{nominal_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % (2 * jitter_ms + 1) - jitter_ms


# Characters an idempotency key may not hold: controls (C0, DEL, C1), the bidirectional
# marks, embeddings, overrides and isolates (a key that reads otherwise than it compares), and
# lone surrogates (no Unicode text; Python strings only).
_BAD_KEY_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                           "\u2066-\u2069\ud800-\udfff]")


def check_idempotency_key(key: Any) -> str:
    """The key in Unicode NFC (``café`` typed either way is one key), checked before a job id
    is derived from it."""
    if isinstance(key, str) and not key.isascii():  # ASCII is NFC already
        key = unicodedata.normalize("NFC", key)
    if not isinstance(key, str) or not 1 <= len(key) <= 255:
        raise ValidationError("idempotencyKey", "must be a string of 1-255 characters")
    _no_bad_char(key, "idempotencyKey")
    return key


def _no_bad_char(key: str, field: str) -> None:
    bad = _BAD_KEY_CHAR.search(key)
    if bad is not None:
        raise ValidationError(field, f"holds U+{ord(bad.group()):04X} at {bad.start()}: no "
                              "control or bidirectional-formatting characters")


def check_dedup(spec: JobSpec) -> Dedup:
    """The spec's dedup window checked (key in NFC, as idempotency keys are), each error
    naming the API's field: a debounced job runs ttl after the last create, so it takes no
    runAt or cron and is not created paused."""
    d = spec.dedup
    if not isinstance(d, Dedup):
        raise ValidationError("dedup", "expected a Dedup(key, ttl_ms, mode)")
    key = d.key
    if isinstance(key, str) and not key.isascii():
        key = unicodedata.normalize("NFC", key)
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_DEDUP_KEY:
        raise ValidationError("dedup.key", f"must be a string of 1-{MAX_DEDUP_KEY} characters")
    _no_bad_char(key, "dedup.key")
    ttl = d.ttl_ms
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_DEDUP_TTL_MS:
        raise ValidationError("dedup.ttlSeconds", "must be more than 0 and at most 30 days "
                              f"(2592000 seconds), got {ttl!r} ms")
    if d.mode not in DEDUP_MODES:
        raise ValidationError("dedup.mode", "must be 'ttl', 'untilDone' or 'debounce', "
                              f"got {d.mode!r}")
    if d.mode == "debounce":
        for field, given in (("runAt", spec.run_at is not None), ("cron", spec.cron is not None),
                             ("paused", bool(spec.paused))):
            if given:
                raise ValidationError(field, "not with dedup mode debounce: a debounced job "
                                      "runs ttlSeconds after the last create")
    return d if key == d.key else Dedup(key, ttl, d.mode)


_USUAL = JobSpec("")
"""A spec with JobSpec's defaults: prepare's shortcut compares a spec's settings with these by
identity (a setting left at its default is that very object; anything else takes the checks)."""


def prepare(spec: JobSpec, job_id: str, now_ms: int, max_payload_bytes: int) -> Prepared:
    """Check every field (each error names it) and build what lua/schedule.lua stores.

    Runs once per job of every batch, so it builds no intermediate dicts: the stored values,
    the spec blob and the Job come straight from the checked fields.  A one-off job with every
    setting at its default (most of a batch) skips the checks its settings need not: the same
    Prepared (tests/redis/test_client.py holds the two ways against each other), at a third of the
    cost (make bench)."""
    run_at, u = spec.run_at, _USUAL
    if (spec.cron is None and spec.tz is None and spec.idempotency_key is None
            and spec.max_attempts is u.max_attempts and spec.backoff_base_ms is u.backoff_base_ms
            and spec.backoff_cap_ms is u.backoff_cap_ms and spec.priority is u.priority
            and spec.timeout_ms is u.timeout_ms and spec.jitter_ms is u.jitter_ms
            and spec.catch_up_window_ms is u.catch_up_window_ms and spec.misfire is u.misfire
            and spec.overlap is u.overlap and spec.start_at is None and spec.end_at is None
            and spec.max_runs is None and spec.pause_after_failures is None
            and spec.start_deadline_ms is None and spec.limit_key is None
            and spec.target is None and (run_at is None or run_at.__class__ is int and run_at > 0)
            and spec.type.__class__ is str and spec.queue.__class__ is str
            and (spec.type, spec.queue) in _seen_names):
        try:
            payload = packer.pack(spec.payload)
        except Exception:  # the checks below name the error
            payload = None
        if (payload is not None and len(payload) <= max_payload_bytes
                and (shallow_msgpack(payload) or not too_deep(spec.payload))):
            # pack_spec of these settings, as the checked way packs them (run_at_ms: see there)
            blob = pack_default_spec(payload, None if run_at else 0)
            nominal = run_at or now_ms
            job = Job(job_id, spec.type, spec.queue, spec.payload,
                      _PAUSED if spec.paused else _SCHEDULED, run_at, None, "UTC", nominal or None,
                      u.max_attempts, u.backoff_base_ms, u.backoff_cap_ms, u.priority,
                      u.timeout_ms, None, _RUN_ONCE, u.jitter_ms, now_ms, now_ms, None,
                      u.catch_up_window_ms, None, _ALLOW)
            return _new_tuple(Prepared, (job, blob, "", nominal, nominal))
    return _prepare_checked(spec, job_id, now_ms, max_payload_bytes)


def _prepare_checked(spec: JobSpec, job_id: str, now_ms: int, max_payload_bytes: int
                     ) -> Prepared:
    """prepare, every field checked."""
    jtype, queue, cron, key = spec.type, spec.queue, spec.cron, spec.idempotency_key
    max_attempts, base, cap = spec.max_attempts, spec.backoff_base_ms, spec.backoff_cap_ms
    priority, timeout, jitter = spec.priority, spec.timeout_ms, spec.jitter_ms
    tz = "UTC" if spec.tz is None else spec.tz  # not `or`: an empty zone is refused, not UTC
    usual = usual_fast(jtype, queue, max_attempts, base, cap, priority, timeout, jitter)
    if not usual:
        check_names(jtype, queue)
    target = None
    stored = spec.payload
    if spec.target is not None or jtype == HTTP_TYPE:
        target = _target(spec)
        stored = wrap_target(target, spec.payload)
    try:
        payload = packer.pack(stored)
    except OverflowError:
        raise ValidationError(*_too_big(spec.payload)) from None
    except (TypeError, ValueError, RecursionError) as e:
        if isinstance(e, RecursionError) or "recursion limit" in str(e):  # msgpack's own
            # nesting limit, which a cycle reaches too
            raise ValidationError("payload", f"{TOO_DEEP}; the limit is {VALUE_DEPTH}") from None
        raise ValidationError("payload", f"not serializable: {e}") from None
    if len(payload) > max_payload_bytes:
        raise PayloadTooLarge("payload", f"{len(payload)} bytes encoded, over the limit of "
                                         f"{max_payload_bytes}")
    check_depth(spec.payload, "payload", payload)
    run_at_ms = 0
    if cron is not None:
        if spec.run_at is not None:
            raise ValidationError("runAt", "give either runAt or cron, not both")
        if not isinstance(cron, str):
            raise ValidationError("cron", "must be a string")
        schedule = parse_cron(cron, tz)  # raises naming cron or timeZone
    else:
        if spec.tz is not None:
            validate_zone(spec.tz)
        if (run_at := spec.run_at) is not None:  # epoch ms (every HTTP runAt) skips to_ms
            run_at_ms = run_at if type(run_at) is int else to_ms(run_at, "runAt")
            if run_at_ms < 0:
                raise ValidationError("runAt", "must be after 1970")
    if not usual:  # raises naming the field, or passes an int subclass
        check_ints((max_attempts, base, cap, priority, timeout, jitter))
    m = spec.misfire  # __class__ first: isinstance is a call
    misfire, misfire_text = (_MISFIRES.get(m, _NO_MISFIRE) if m.__class__ is str
                             or isinstance(m, str) else _NO_MISFIRE)
    if misfire is None:
        raise ValidationError("misfire", "must be 'run_once' (or 'runOnce') or 'skip'")
    o = spec.overlap
    overlap, overlap_text = _OVERLAPS.get(o, _NO_MISFIRE) if isinstance(o, str) else _NO_MISFIRE
    if overlap is None:
        raise ValidationError("overlap",
                              "must be 'allow', 'skip', 'bufferOne' or 'cancelPrevious'")
    if overlap is not Overlap.ALLOW and cron is None:
        raise ValidationError("overlap", "applies to recurring jobs only (give cron)")
    life = NO_LIFE
    if (spec.start_at is not None or spec.end_at is not None or spec.max_runs is not None
            or spec.pause_after_failures is not None or spec.start_deadline_ms is not None):
        life = _life(spec, cron is not None)
    catch_up = spec.catch_up_window_ms
    if catch_up.__class__ is not int or not 0 <= catch_up <= MAX_CATCH_UP_MS:
        _int(catch_up, "catchUpWindowSeconds", 0, MAX_CATCH_UP_MS)
    if key is not None:
        key = check_idempotency_key(key)
    limit_key = spec.limit_key
    if limit_key is not None:
        limit_key = check_limit_key(limit_key)
    # The spec blob holds every other setting, so it doubles as the canonical body to hash.
    # run_at_ms nil: a runAt is the job's first occurrence, which the job hash holds (models).
    blob = pack_spec(timeout, base, cap, priority, tz, misfire_text, jitter, key or "",
                     None if run_at_ms or cron is not None else 0, payload, catch_up,
                     overlap_text, None if life is NO_LIFE else life_packed(life))
    body_hash = ""
    if key is not None:  # run_at_ms too: the blob leaves a runAt out
        d = spec.dedup  # part of the body; a debounced job's runAt is the service's, not asked
        head = (f"{jtype}\0{queue}\0{max_attempts}\0{cron}\0{bool(spec.paused)}\0"
                f"{0 if d is not None and d.mode == 'debounce' else run_at_ms}\0")
        if d is not None:
            head += f"{d.key}\0{d.ttl_ms}\0{d.mode}\0"
        if limit_key is not None:
            head += f"{limit_key}\0"
        body_hash = hashlib.blake2b(head.encode() + blob, digest_size=16).hexdigest()
    if cron is not None:
        nominal = bounded(schedule.next_after, life)(now_ms)
        if nominal >= NEVER_MS:
            raise ValidationError("endAt", "no occurrence of the schedule is left before endAt")
        score = due_score(nominal + jitter_offset_ms(job_id, nominal, jitter), priority)
    else:
        nominal = run_at_ms or now_ms
        score = nominal - priority / PRIORITY_SCALE if priority else nominal  # due_score
    job = Job(job_id, jtype, queue, spec.payload, _PAUSED if spec.paused else _SCHEDULED,
              run_at_ms or None, cron or None, tz, nominal or None, max_attempts, base, cap,
              priority, timeout, key or None, misfire, jitter, now_ms, now_ms, None, catch_up,
              None, overlap)
    if life is not NO_LIFE:  # not a keyword argument above, which every job would pay for
        job.life = life
    if limit_key is not None:
        job.limit_key = limit_key
    if target is not None:
        job.target = target
    # tuple.__new__ is what Prepared(...) calls, without the Python-level __new__
    return _new_tuple(Prepared, (job, blob, body_hash, nominal, score))


_new_tuple = tuple.__new__


def _target(spec: JobSpec) -> dict[str, Any]:
    """An http job's target, checked: a target needs type http, and type http a target."""
    if spec.target is None:
        raise ValidationError("target", f"required for a job of type {HTTP_TYPE!r}: the url "
                              "to call")
    if spec.type != HTTP_TYPE:
        raise ValidationError("type", f"must be {HTTP_TYPE!r} for a job with a target")
    return check_target(spec.target)


def _time_ms(value: Any, field: str) -> int:
    ms = value if type(value) is int else to_ms(value, field)
    if not 0 <= ms <= MAX_TIME_MS:
        raise ValidationError(field, "must be between 1970 and 9999 (UTC)")
    return ms


def _life(spec: JobSpec, recurring: bool) -> Life:
    """The lifecycle limits given, checked: each applies to one kind of job only."""
    for field, value, for_recurring in (
            ("startAt", spec.start_at, True), ("endAt", spec.end_at, True),
            ("maxRuns", spec.max_runs, True), ("pauseAfterFailures", spec.pause_after_failures,
                                               True),
            ("startDeadlineSeconds", spec.start_deadline_ms, False)):
        if value is not None and for_recurring != recurring:
            kind = "recurring jobs only (give cron)" if for_recurring else "one-off jobs only"
            raise ValidationError(field, "applies to " + kind)
    start = 0 if spec.start_at is None else _time_ms(spec.start_at, "startAt")
    end = 0 if spec.end_at is None else _time_ms(spec.end_at, "endAt")
    if end and end <= start:
        raise ValidationError("endAt", "must be after startAt")
    return Life(
        start, end,
        0 if spec.max_runs is None else _int(spec.max_runs, "maxRuns", 1, MAX_RUNS_LIMIT),
        0 if spec.start_deadline_ms is None else _int(
            spec.start_deadline_ms, "startDeadlineSeconds", 1, MAX_START_DEADLINE_MS),
        0 if spec.pause_after_failures is None else _int(
            spec.pause_after_failures, "pauseAfterFailures", 1, MAX_PAUSE_AFTER))

INT_RANGE = (-(2**63), 2**64 - 1)
"""The integers a payload keeps exactly: what msgpack (the stored form, which workers in any
language decode) holds.  One beyond them is refused, never turned into a float."""


def _too_big(payload: Any) -> tuple[str, str]:
    """(field, reason) for the first integer of ``payload`` outside INT_RANGE, named by its
    path (``payload.items[2].n``); a loop, not recursion: it runs before the depth check."""
    lo, hi = INT_RANGE
    stack: list[tuple[str, Any]] = [("payload", payload)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{path}.{k}", v) for k, v in reversed(value.items())]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, int) and not lo <= value <= hi:
            return path, f"integer beyond 64 bits ({lo} to {hi}); send it as a string"
    return "payload", "not serializable: an integer beyond 64 bits"


def next_occurrence(
    cron: str, tz: str, after_ms: int, job_id: str, jitter_ms: int, priority: int = 0,
    life: Life = NO_LIFE,
) -> tuple[int, float | int]:
    """(nominal, due score) of a recurring job's first occurrence after ``after_ms`` inside its
    [startAt, endAt]; (0, 0) when none is left."""
    nominal = bounded(parse_cron(cron, tz).next_after, life)(after_ms)
    if nominal >= NEVER_MS:
        return 0, 0
    return nominal, due_score(nominal + jitter_offset_ms(job_id, nominal, jitter_ms), priority)
