"""camelCase JSON in, validated into JobSpec / JobPatch: what POST and PATCH /jobs take, and
`rsched jobs add` builds.

Times come in as ISO-8601 strings; durations are seconds on the wire and milliseconds inside.
Every rejection names the field as the caller spelled it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from rsched.core import defaults
from rsched.core.errors import NotFound, ValidationError
from rsched.core.http_target import HTTP_TYPE
from rsched.core.models import BackfillOverlap, job_of_run, partition_of
from rsched.core.spec import MAX_TIME_MS, Dedup, JobSpec
from rsched.core.times import to_ms
from rsched.service.patch import UNSET, JobPatch

JOB_FIELDS = ("type", "payload", "runAt", "cron", "timeZone", "queue", "maxAttempts",
              "idempotencyKey", "priority", "timeoutSeconds", "backoff", "misfire",
              "jitterSeconds", "paused", "catchUpWindowSeconds", "overlap", "startAt", "endAt",
              "maxRuns", "pauseAfterFailures", "startDeadlineSeconds", "dedup", "limitKey",
              "target")
LIFE_FIELDS = ("startAt", "endAt", "maxRuns", "pauseAfterFailures", "startDeadlineSeconds")
PATCH_FIELDS = ("runAt", "cron", "timeZone", "payload", "maxAttempts", "priority", "misfire",
                "catchUpWindowSeconds", "overlap", *LIFE_FIELDS)
BACKOFF_FIELDS = ("baseSeconds", "capSeconds")
DEDUP_FIELDS = ("key", "ttlSeconds", "mode")


def as_object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(field, f"expected a JSON object, got {_kind(value)}")
    return value


def reject_unknown(d: dict[str, Any], known: tuple[str, ...], prefix: str = "") -> None:
    for name in d:
        if name not in known:
            raise ValidationError(prefix + name,
                                  "unknown field; expected one of " + ", ".join(known))


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    return "an array" if isinstance(v, list) else "an object"


def _string(v: Any, field: str) -> str:
    if not isinstance(v, str):
        raise ValidationError(field, f"expected a string, got {_kind(v)}")
    return v


def _integer(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValidationError(field, f"expected an integer, got {_kind(v)}")
    return v


# Bounds in seconds, as the OpenAPI document states them (checked before rounding to ms).
SECONDS_RANGE = {
    "timeoutSeconds": (0.001, 604_800), "jitterSeconds": (0, 86_400),
    "backoff.baseSeconds": (0, 86_400), "backoff.capSeconds": (0, 2_592_000),
    "catchUpWindowSeconds": (0, 2_592_000), "startDeadlineSeconds": (0.001, 2_592_000),
    "dedup.ttlSeconds": (0.001, 2_592_000),
}


def _seconds_ms(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValidationError(field, f"expected a number of seconds, got {_kind(v)}")
    lo, hi = SECONDS_RANGE[field]
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ValidationError(field, f"must be between {lo} and {hi} seconds, got {v}")
    return round(v * 1000)


def _time(v: Any, field: str) -> int:
    return _iso_ms(_string(v, field), field)


@lru_cache(maxsize=4096)
def _iso_ms(text: str, field: str) -> int:
    """Parsed once per distinct text: a batch's jobs often share their times (errors are not
    cached, they raise each time)."""
    ms = to_ms(text, field)
    if not 0 <= ms <= MAX_TIME_MS:
        raise ValidationError(field, "must be between 1970 and 9999 (UTC)")
    return ms


def _payload(v: Any, field: str) -> Any:
    return v


def _flag(v: Any, field: str) -> bool:
    if not isinstance(v, bool):
        raise ValidationError(field, f"expected a boolean, got {_kind(v)}")
    return v


def _dedup(v: Any, field: str) -> Dedup:
    """``{"key", "ttlSeconds", "mode"}``; the key and mode are checked with the rest of the
    window (core.spec.check_dedup)."""
    d = as_object(v, field)
    reject_unknown(d, DEDUP_FIELDS, field + ".")
    for name in ("key", "ttlSeconds"):
        if d.get(name) is None:
            raise ValidationError(f"{field}.{name}", "required")
    mode = d.get("mode")
    return Dedup(_string(d["key"], f"{field}.key"),
                 _seconds_ms(d["ttlSeconds"], f"{field}.ttlSeconds"),
                 defaults.DEDUP_MODE if mode is None else _string(mode, f"{field}.mode"))


# JSON field -> (JobSpec attribute, converter); every converter names the field it rejects.
_JOB_INPUT: dict[str, tuple[str, Any]] = {
    "type": ("type", _string), "payload": ("payload", _payload), "runAt": ("run_at", _time),
    "cron": ("cron", _string), "timeZone": ("tz", _string), "queue": ("queue", _string),
    "idempotencyKey": ("idempotency_key", _string), "misfire": ("misfire", _string),
    "maxAttempts": ("max_attempts", _integer), "priority": ("priority", _integer),
    "timeoutSeconds": ("timeout_ms", _seconds_ms), "jitterSeconds": ("jitter_ms", _seconds_ms),
    "paused": ("paused", _flag), "catchUpWindowSeconds": ("catch_up_window_ms", _seconds_ms),
    "overlap": ("overlap", _string), "startAt": ("start_at", _time), "endAt": ("end_at", _time),
    "maxRuns": ("max_runs", _integer), "pauseAfterFailures": ("pause_after_failures", _integer),
    "startDeadlineSeconds": ("start_deadline_ms", _seconds_ms), "dedup": ("dedup", _dedup),
    "limitKey": ("limit_key", _string),
    "target": ("target", _payload),  # checked with the job (core.http_target.check_target)
}
assert set(_JOB_INPUT) | {"backoff"} == set(JOB_FIELDS)


# JSON field -> (JobSpec attribute, the exact type it takes as is): such a value needs no
# converter call, and the exact type keeps out what the converters reject (True is no integer).
_AS_IS: dict[str, tuple[str, type]] = {
    name: (attr, {_string: str, _integer: int, _flag: bool}[conv])
    for name, (attr, conv) in _JOB_INPUT.items() if conv in (_string, _integer, _flag)
}


def spec_from_json(value: Any, where: str = "body") -> JobSpec:
    """POST /jobs body (or one item of a batch) -> JobSpec; null means "use the default"."""
    d = value if type(value) is dict else as_object(value, where)
    kw: dict[str, Any] = {}
    for name, v in d.items():
        as_is = _AS_IS.get(name)
        if as_is is not None and type(v) is as_is[1]:
            kw[as_is[0]] = v
            continue
        if name == "payload":  # any JSON value, null included (the default)
            kw["payload"] = v
            continue
        if name == "runAt" and type(v) is str:
            kw["run_at"] = _iso_ms(v, name)
            continue
        conv = _JOB_INPUT.get(name)
        if conv is None and name != "backoff":
            reject_unknown(d, JOB_FIELDS)
        if v is None:
            continue
        if conv is not None:
            kw[conv[0]] = conv[1](v, name)
            continue
        b = as_object(v, "backoff")
        reject_unknown(b, BACKOFF_FIELDS, "backoff.")
        for bname, attr in (("baseSeconds", "backoff_base_ms"), ("capSeconds", "backoff_cap_ms")):
            if b.get(bname) is not None:
                kw[attr] = _seconds_ms(b[bname], f"backoff.{bname}")
    if "type" not in kw:
        if "target" in kw:  # an HTTP target's type goes without saying
            kw["type"] = HTTP_TYPE
        else:
            raise ValidationError("type", "required: the name of a registered handler")
    return JobSpec(**kw)


BACKFILL_FIELDS = ("from", "to", "dryRun", "overlap")


def backfill_overlap(value: Any, field: str = "overlap") -> BackfillOverlap:
    """A backfill's overlap policy by its name; ValidationError naming ``field``."""
    if isinstance(value, BackfillOverlap):
        return value
    known = {o.value: o for o in BackfillOverlap}
    if isinstance(value, str) and value in known:
        return known[value]
    raise ValidationError(field, "must be " + ", ".join(repr(v) for v in known))


def backfill_range(start: Any, end: Any) -> tuple[int, int]:
    """A backfill's [from, to) in ms: epoch ms, aware datetimes or ISO-8601 (1970-9999)."""
    out = []
    for v, name in ((start, "from"), (end, "to")):
        if v is None:
            raise ValidationError(name, "required: an ISO-8601 time")
        ms = _iso_ms(v, name) if isinstance(v, str) else to_ms(v, name)
        if not 0 <= ms <= MAX_TIME_MS:
            raise ValidationError(name, "must be between 1970 and 9999 (UTC)")
        out.append(ms)
    return out[0], out[1]


def backfill_from_json(value: Any) -> tuple[int, int, bool, BackfillOverlap]:
    """POST /jobs/{id}/backfill body -> (from ms, to ms, dry run, overlap)."""
    d = as_object(value, "body")
    reject_unknown(d, BACKFILL_FIELDS)
    for name in ("from", "to"):
        if name not in d:
            raise ValidationError(name, "required: an ISO-8601 time")
        _string(d[name], name)
    start, end = backfill_range(d.get("from"), d.get("to"))
    dry = d.get("dryRun", False)
    overlap = backfill_overlap(d.get("overlap", defaults.BACKFILL_OVERLAP))
    return start, end, _flag(dry, "dryRun"), overlap


def patch_from_json(value: Any) -> JobPatch:
    """PATCH /jobs/{id} body -> JobPatch; only ``payload`` and the lifecycle limits (null:
    none) may be null."""
    d = as_object(value, "body")
    reject_unknown(d, PATCH_FIELDS)
    if not d:
        raise ValidationError("body", "nothing to change: give one of " + ", ".join(PATCH_FIELDS))
    kw: dict[str, Any] = {}
    if "runAt" in d:
        kw["run_at"] = _time(d["runAt"], "runAt")
    if "cron" in d:
        kw["cron"] = _string(d["cron"], "cron")
    if "timeZone" in d:
        kw["tz"] = _string(d["timeZone"], "timeZone")
    if "payload" in d:
        kw["payload"] = d["payload"]
    if "maxAttempts" in d:
        kw["max_attempts"] = _integer(d["maxAttempts"], "maxAttempts")
    if "priority" in d:
        kw["priority"] = _integer(d["priority"], "priority")
    for name in LIFE_FIELDS:
        if name in d:
            attr, conv = _JOB_INPUT[name]
            kw[attr] = None if d[name] is None else conv(d[name], name)
    for name, attr in (("misfire", "misfire"), ("overlap", "overlap")):
        if name in d:
            kw[attr] = _string(d[name], name)
    if "catchUpWindowSeconds" in d:
        kw["catch_up_window_ms"] = _seconds_ms(d["catchUpWindowSeconds"], "catchUpWindowSeconds")
    patch = JobPatch(**kw)
    if patch.run_at is not UNSET and patch.cron is not UNSET:
        raise ValidationError("runAt", "give either runAt or cron, not both")
    return patch


def known_job_id(job_id: str) -> str:
    """A job id from a path or a flag; NotFound when it cannot be one (no partition prefix)."""
    try:
        partition_of(job_id)
    except ValidationError:
        raise NotFound("job", job_id) from None
    return job_id


def known_run_id(run_id: str) -> str:
    """A run id from a path or a flag; NotFound when it cannot be one."""
    try:
        if "@" not in run_id:
            raise ValidationError("runId", "no @")
        partition_of(job_of_run(run_id))
    except ValidationError:
        raise NotFound("dead letter", run_id) from None
    return run_id
