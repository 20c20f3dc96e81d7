"""What a caller asks for when scheduling a job, validated into the fields of the job hash.

Validation happens here, once, for every face (Python, CLI, HTTP): each error names the field as
the HTTP API spells it, so a caller in any language knows what to fix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack

from .cron import parse_cron, validate_zone
from .errors import PayloadTooLarge, ValidationError
from .models import Misfire, pack_spec

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_QUEUE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MISFIRES = frozenset(m.value for m in Misfire)


def to_ms(value: Any, field: str) -> int:
    """Accept epoch ms (int), an aware datetime, or an ISO-8601 string with an offset or Z."""
    if isinstance(value, bool):
        raise ValidationError(field, "expected a time, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValidationError(field, f"not an ISO-8601 time: {value!r}") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValidationError(field, "time needs a UTC offset or Z (ambiguous otherwise)")
        return int(value.timestamp() * 1000)
    raise ValidationError(field, f"expected an ISO-8601 time, got {type(value).__name__}")


def ms_to_iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    dt = _EPOCH + timedelta(milliseconds=ms)  # exact: no float seconds
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}, got {value}")
    return value


@dataclass(slots=True)
class JobSpec:
    """A job to schedule: one-off at ``run_at`` (default now) or recurring on ``cron`` in ``tz``."""

    type: str
    payload: Any = None
    run_at: Any = None
    cron: str | None = None
    tz: str | None = None
    queue: str = "default"
    max_attempts: int = 3
    backoff_base_ms: int = 1000
    backoff_cap_ms: int = 3_600_000
    priority: int = 0
    timeout_ms: int = 300_000
    idempotency_key: str | None = None
    misfire: str = Misfire.RUN_ONCE.value
    jitter_ms: int = 0
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated spec: every logical field, the job hash to store, its due-set position."""

    logical: dict[str, Any]
    fields: dict[str, Any]  # the job hash as stored (see models.SPEC_ORDER)
    body_hash: str
    next_ms: int  # nominal next occurrence
    score: float  # due score: next_ms plus the job's deterministic jitter, priority-ordered


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


def validate(spec: JobSpec, max_payload_bytes: int) -> tuple[dict[str, Any], str]:
    """Check every field; return the static hash fields and the body hash for idempotency."""
    if not isinstance(spec.type, str) or not _NAME.fullmatch(spec.type):
        raise ValidationError("type", "must be 1-128 characters of letters, digits, _ . : -")
    if not isinstance(spec.queue, str) or not _QUEUE.fullmatch(spec.queue):
        raise ValidationError("queue", "must be 1-64 characters of letters, digits, _ . -")
    try:
        payload = msgpack.packb(spec.payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValidationError("payload", f"not serializable: {e}") from None
    if len(payload) > max_payload_bytes:
        raise PayloadTooLarge(
            "payload", f"{len(payload)} bytes encoded, over the limit of {max_payload_bytes}"
        )
    run_at_ms = None
    cron = spec.cron
    tz = spec.tz or "UTC"
    if cron is not None:
        if spec.run_at is not None:
            raise ValidationError("runAt", "give either runAt or cron, not both")
        if not isinstance(cron, str):
            raise ValidationError("cron", "must be a string")
        parse_cron(cron, tz)  # raises naming cron or timeZone
    else:
        if spec.tz is not None:
            validate_zone(spec.tz)
        if spec.run_at is not None:
            run_at_ms = to_ms(spec.run_at, "runAt")
            if run_at_ms < 0:
                raise ValidationError("runAt", "must be after 1970")
    max_attempts = _int(spec.max_attempts, "maxAttempts", 1, MAX_ATTEMPTS_LIMIT)
    base = _int(spec.backoff_base_ms, "backoff.baseSeconds", 0, 86_400_000)
    cap = _int(spec.backoff_cap_ms, "backoff.capSeconds", 0, 30 * 86_400_000)
    priority = _int(spec.priority, "priority", -1000, 1000)
    timeout = _int(spec.timeout_ms, "timeoutSeconds", 1, MAX_TIMEOUT_MS)
    jitter = _int(spec.jitter_ms, "jitterSeconds", 0, 86_400_000)
    misfire = spec.misfire
    if misfire not in _MISFIRES:
        raise ValidationError("misfire", "must be 'run_once' or 'skip'")
    key = spec.idempotency_key
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 255):
        raise ValidationError("idempotencyKey", "must be a string of 1-255 characters")
    fields: dict[str, Any] = {
        "type": spec.type, "queue": spec.queue, "payload": payload,
        "run_at_ms": run_at_ms or 0, "cron": cron or "", "tz": tz,
        "max_attempts": max_attempts, "backoff_base_ms": base, "backoff_cap_ms": cap,
        "priority": priority, "timeout_ms": timeout, "misfire": misfire, "jitter_ms": jitter,
        "idem_key": key or "",
    }
    # The spec blob holds every other setting, so it doubles as the canonical body to hash.
    blob = pack_spec(fields)
    fields["spec"] = blob
    head = f"{spec.type}\0{spec.queue}\0{max_attempts}\0{cron}\0{bool(spec.paused)}\0"
    body_hash = hashlib.blake2b(head.encode() + blob, digest_size=16).hexdigest()
    return fields, body_hash


def prepare(spec: JobSpec, job_id: str, now_ms: int, max_payload_bytes: int) -> Prepared:
    f, body_hash = validate(spec, max_payload_bytes)
    if f["cron"]:
        nominal = parse_cron(f["cron"], f["tz"]).next_after(now_ms)
        score = due_score(nominal + jitter_offset_ms(job_id, nominal, f["jitter_ms"]),
                          f["priority"])
    else:
        nominal = f["run_at_ms"] or now_ms
        score = due_score(nominal, f["priority"])
    status = "paused" if spec.paused else "scheduled"
    f.update(id=job_id, next_ms=nominal, status=status)
    stored = {
        "id": job_id, "type": f["type"], "queue": f["queue"], "status": status,
        "next_ms": nominal, "max_attempts": f["max_attempts"], "cron": f["cron"],
        "spec": f.pop("spec"),
    }
    return Prepared(f, stored, body_hash, nominal, score)


def next_occurrence(
    cron: str, tz: str, after_ms: int, job_id: str, jitter_ms: int, priority: int = 0
) -> tuple[int, float | int]:
    """(nominal, due score) of a recurring job's first occurrence after ``after_ms``."""
    nominal = parse_cron(cron, tz).next_after(after_ms)
    return nominal, due_score(nominal + jitter_offset_ms(job_id, nominal, jitter_ms), priority)
