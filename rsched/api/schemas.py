"""The component schemas of the OpenAPI document (rsched.api.openapi): the bodies the API reads
and writes, each bound one the API enforces (rsched.service.inputs, rsched.core.spec).
"""

from __future__ import annotations

from typing import Any

from rsched.archive.store import SORTS
from rsched.core import defaults
from rsched.core.http_target import MAX_HEADERS, MAX_TIMEOUT_S, MAX_URL_CHARS, METHODS
from rsched.core.models import BackfillOverlap, JobStatus
from rsched.core.spec import KEY_NAME_PATTERN, QUEUE_PATTERN, TYPE_PATTERN
from rsched.core.values import VALUE_DEPTH

REF = "#/components/schemas/"


def ref(name: str) -> dict[str, Any]:
    """A reference to the component schema ``name``."""
    return {"$ref": REF + name}


def _n(t: str, **kw: Any) -> dict[str, Any]:
    """A nullable ``t``."""
    return {"type": [t, "null"], **kw}


TIME = {"type": "string", "format": "date-time"}
NTIME = _n("string", format="date-time")

# The lifecycle limits, as POST and PATCH take them (null: none).
LIFE_INPUT: dict[str, Any] = {
    "startAt": {**NTIME, "description": "Recurring: no occurrence before it."},
    "endAt": {**NTIME, "description": "Recurring: no occurrence after it; the job then "
                                       "completes. Must be after startAt and leave one."},
    "maxRuns": _n("integer", minimum=1, maximum=1_000_000_000,
                  description="Recurring: the job completes after this many runs started "
                              "(skipped occurrences do not count)."),
    "pauseAfterFailures": _n("integer", minimum=1, maximum=1_000_000,
                             description="Recurring: this many dead-lettered occurrences in "
                                         "a row pause the job (pausedReason says why)."),
    "startDeadlineSeconds": _n("number", minimum=0.001, maximum=2592000,
                               description="One-off: not started by runAt plus this, the run "
                                           "is dead-lettered (missed start deadline), never "
                                           "run late."),
}
_NSTR = _n("string")
LIFE_OUTPUT: dict[str, Any] = {
    "startAt": NTIME, "endAt": NTIME, "maxRuns": _n("integer"),
    "remainingRuns": _n("integer", minimum=0, description="maxRuns less the runs started "
                                                         "while it was set."),
    "pauseAfterFailures": _n("integer"),
    "deadLetterStreak": {"type": "integer", "minimum": 0,
                         "description": "Dead-lettered occurrences in a row (a success or a "
                                        "resume resets it)."},
    "startDeadlineSeconds": _n("number"),
    "pausedAt": NTIME, "pausedBy": {**_NSTR, "description": "API key name, cli, python, or "
                                                          "pauseAfterFailures (rsched paused it)."},
    "pauseNote": _NSTR, "pausedReason": _NSTR, "resumedAt": NTIME, "resumedBy": _NSTR,
    "resumeNote": _NSTR,
}

# An HTTP target (core.http_target.check_target enforces each bound).
TARGET: dict[str, Any] = {
    "additionalProperties": False, "required": ["url"],
    "properties": {
        "url": {"type": "string", "maxLength": MAX_URL_CHARS, "format": "uri",
                "description": "http or https, no user info."},
        "method": {"type": ["string", "null"], "enum": [*METHODS, None],
                   "description": "Default POST."},
        "headers": {"type": ["object", "null"], "maxProperties": MAX_HEADERS,
                    "additionalProperties": {"type": "string"},
                    "description": "At most 50, 16 KiB in all; not Host, Content-Length, "
                                   "Transfer-Encoding, Connection or Rsched-*."},
        "body": {"description": "Any JSON value, sent as JSON; default: the job's payload."},
        "timeoutSeconds": {"type": ["number", "null"], "exclusiveMinimum": 0,
                           "maximum": MAX_TIMEOUT_S, "description": "Per attempt; default 30."},
    },
}

SCHEMAS: dict[str, Any] = {
    "JobCreate": {
        "type": "object", "additionalProperties": False, "required": ["type"],
        "description": "A job to schedule: one-off at runAt (default now) or recurring on cron "
                       "in timeZone. null means the default.",
        "properties": {
            "type": {"type": "string", "pattern": TYPE_PATTERN,
                     "description": "Name of a handler registered in the workers' rsched.App."},
            "payload": {"description": "Any JSON value; at most 64 KiB once msgpack-encoded "
                                       f"(configurable), arrays and objects nested at most "
                                       f"{VALUE_DEPTH} deep."},
            "runAt": {**NTIME, "description": "When to run a one-off job; the past means now."},
            "cron": _n("string", description="5 fields, or 6 with seconds first, or a macro "
                        "(@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)."),
            "timeZone": _n("string", description="IANA zone for cron (default UTC)."),
            "queue": _n("string", pattern=QUEUE_PATTERN),
            "maxAttempts": _n("integer", minimum=1, maximum=1000),
            "idempotencyKey": _n("string", minLength=1, maxLength=255,
                                 description="The same key again returns the same job (200); "
                                             "with a different body it is a 409. Compared in "
                                             "Unicode NFC; control and bidirectional "
                                             "formatting characters are refused."),
            "priority": _n("integer", minimum=-1000, maximum=1000),
            "timeoutSeconds": _n("number", minimum=0.001, maximum=604800),
            "backoff": {
                "type": ["object", "null"], "additionalProperties": False,
                "properties": {
                    "baseSeconds": _n("number", minimum=0, maximum=86400),
                    "capSeconds": _n("number", minimum=0, maximum=2592000),
                },
            },
            "misfire": {"type": ["string", "null"], "enum": ["run_once", "runOnce", "skip", None],
                        "description": "Occurrences missed by more than catchUpWindowSeconds: "
                                       "the latest runs once (run_once, the default) or none "
                                       "(skip); either way they are recorded once per gap."},
            "catchUpWindowSeconds": _n("number", minimum=0, maximum=2592000,
                                       description="Occurrences missed by less than this "
                                                   "all run, once each, in order (default "
                                                   "60)."),
            "overlap": {"type": ["string", "null"],
                        "enum": ["allow", "skip", "bufferOne", "cancelPrevious", None],
                        "description": "A recurring job's occurrence while its previous run "
                                       "is still queued, running or waiting for a retry: runs "
                                       "anyway (allow, the default), is recorded as a skipped "
                                       "run (skip), waits for it, one at most (bufferOne), or "
                                       "asks it to stop and runs once it has (cancelPrevious)."},
            "jitterSeconds": _n("number", minimum=0, maximum=86400),
            "paused": _n("boolean", description="Create the job paused."),
            "limitKey": _n("string", minLength=1, maxLength=200,
                           pattern=r"^[^*/\x00-\x1f\x7f-\x9f]*$",
                           description="The key whose limit (PUT /limits/{name}) its runs "
                                       "count against; no control characters, '/' or '*'. The "
                                       "job is placed in the key's partition. A key without "
                                       "a definition runs unlimited."),
            **LIFE_INPUT,
            "target": {**TARGET, "type": ["object", "null"], "description":
                       "An HTTP target (docs/http-targets.md): a worker started with --http "
                       "calls the URL at each run, signed; needs type http (the default "
                       "with a target). The body defaults to the payload, sent as JSON."},
            "dedup": {
                "type": ["object", "null"], "additionalProperties": False,
                "required": ["key", "ttlSeconds"],
                "description": "A dedup window (docs/dedup.md): creates with the same key "
                               "answer one job (200, deduplicated true) instead of creating "
                               "another. ttl: the first job, for ttlSeconds after it. "
                               "untilDone: the job until it completes, is dead-lettered or "
                               "cancelled, ttlSeconds at most. debounce: each create within "
                               "ttlSeconds of the previous one moves the job to ttlSeconds "
                               "after it, with its payload and settings (not with runAt, "
                               "cron or paused). Beside an idempotencyKey, the job lives in "
                               "the dedup key's partition, so the idempotency key is one per "
                               "dedup key.",
                "properties": {
                    "key": {"type": "string", "minLength": 1, "maxLength": 200,
                            "description": "Compared in Unicode NFC; control and "
                                           "bidirectional formatting characters are refused."},
                    "ttlSeconds": {"type": "number", "exclusiveMinimum": 0,
                                   "maximum": 2592000},
                    "mode": {"type": ["string", "null"],
                             "enum": ["ttl", "untilDone", "debounce", None],
                             "description": "Default ttl."},
                },
            },
        },
    },
    "JobPatch": {
        "type": "object", "additionalProperties": False, "minProperties": 1,
        "description": "Reschedule (runAt, or cron and timeZone, startAt or endAt: the next "
                       "run is computed from now) or change the payload, maxAttempts, "
                       "priority, a recurring job's schedule policy (misfire, "
                       "catchUpWindowSeconds, overlap), maxRuns, pauseAfterFailures or "
                       "startDeadlineSeconds (null removes a limit).",
        "properties": {
            "runAt": TIME, "cron": {"type": "string"}, "timeZone": {"type": "string"},
            "payload": {}, "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 1000},
            "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
            **LIFE_INPUT,
            "misfire": {"type": "string", "enum": ["run_once", "runOnce", "skip"]},
            "catchUpWindowSeconds": {"type": "number", "minimum": 0, "maximum": 2592000},
            "overlap": {"type": "string",
                        "enum": ["allow", "skip", "bufferOne", "cancelPrevious"]},
        },
    },
    "ControlNote": {
        "type": "object", "additionalProperties": False,
        "properties": {"note": _n("string", maxLength=1000,
                                  description="Kept in the job with who and when.")},
    },
    "Job": {
        "type": "object",
        "required": ["id", "type", "queue", "status", "payload", "runAt", "cron", "timeZone",
                     "nextRunAt", "maxAttempts", "backoff", "priority", "timeoutSeconds",
                     "idempotencyKey", "misfire", "jitterSeconds", "lastRunId", "createdAt",
                     "updatedAt", "catchUpWindowSeconds", "lastGap", "overlap", "version",
                     "limitKey", "target", *LIFE_OUTPUT],
        "properties": {
            "id": {"type": "string"}, "type": {"type": "string"}, "queue": {"type": "string"},
            "status": {"type": "string", "enum": [s.value for s in JobStatus]},
            "payload": {}, "runAt": NTIME, "cron": _n("string"), "timeZone": {"type": "string"},
            "nextRunAt": NTIME, "maxAttempts": {"type": "integer"},
            "backoff": {"type": "object", "required": ["baseSeconds", "capSeconds"],
                        "properties": {"baseSeconds": {"type": "number"},
                                       "capSeconds": {"type": "number"}}},
            "priority": {"type": "integer"}, "timeoutSeconds": {"type": "number"},
            "idempotencyKey": _n("string"), "misfire": {"type": "string"},
            "jitterSeconds": {"type": "number"}, "lastRunId": _n("string"),
            "createdAt": TIME, "updatedAt": TIME, "catchUpWindowSeconds": {"type": "number"},
            "overlap": {"type": "string",
                        "enum": ["allow", "skip", "bufferOne", "cancelPrevious"]},
            "version": {"type": "integer", "minimum": 1,
                        "description": "1, plus one per change (PATCH, pause, resume, cancel); "
                                       "send it as If-Match to change only this version."},
            "limitKey": _n("string"),
            "target": {**TARGET, "type": ["object", "null"],
                       "description": "An http job's target (null for any other job)."},
            "lastGap": {
                "type": ["object", "null"], "required": ["count", "exact", "from", "to"],
                "description": "The latest occurrences missed by more than the catch-up "
                               "window, skipped together (count is a lower bound unless "
                               "exact).",
                "properties": {"count": {"type": "integer"}, "exact": {"type": "boolean"},
                               "from": TIME, "to": TIME},
            },
            **LIFE_OUTPUT,
        },
    },
    "JobPage": {
        "type": "object", "required": ["jobs", "nextCursor", "indexed", "sort", "indexedUntil"],
        "properties": {
            "jobs": {"type": "array", "items": ref("JobListed")},
            "nextCursor": _n("string"),
            "indexed": {"type": "boolean", "description":
                        "Read from the archive's job index (sorted, every page full until the "
                        "last); false: by SCAN over Redis, in no order, a page may be short."},
            "sort": {"type": ["string", "null"], "enum": [*SORTS, None],
                     "description": "The order of an indexed page; null for a scan."},
            "indexedUntil": {**NTIME, "description":
                             "The index holds every change made before this time (the oldest "
                             "event the archiver has not applied yet); null for a scan."},
        },
    },
    "JobListed": {"allOf": [ref("Job"), {
        "type": "object", "required": ["lastRun"],
        "properties": {"lastRun": {
            "type": "object", "description": "The latest run, and how many finished runs in a "
            "row failed (back to the latest success; streakCapped: at least that many).",
            "required": ["runId", "status", "at", "failureStreak", "streakCapped"],
            "properties": {"runId": _n("string"), "status": _n("string"), "at": NTIME,
                           "failureStreak": {"type": "integer", "minimum": 0},
                           "streakCapped": {"type": "boolean"}}}}}]},
    "BatchRequest": {
        "type": "object", "additionalProperties": False, "required": ["jobs"],
        "properties": {"jobs": {
            "type": "array", "maxItems": 1000,
            "description": "Each item is a JobCreate, validated on its own: an invalid item gets "
                           "its own error in results, naming its fields with the item "
                           "(jobs[3].payload), and the others are still scheduled.",
            "items": {"anyOf": [ref("JobCreate"), {}]},
        }},
    },
    "JobCreated": {
        "description": "A create's answer: the job, and whether a dedup window answered with "
                       "this existing job rather than creating one.",
        "allOf": [ref("Job"), {
            "type": "object", "required": ["deduplicated"],
            "properties": {"deduplicated": {
                "type": "boolean",
                "description": "True: the job another create made within this create's "
                               "dedup window (status 200). An idempotent replay is false."}},
        }],
    },
    "BatchResult": {
        "type": "object", "required": ["status"],
        "properties": {"status": {"type": "integer"}, "job": ref("JobCreated"),
                       "error": ref("Problem")},
    },
    "BatchResponse": {
        "type": "object", "required": ["results"],
        "properties": {"results": {"type": "array", "items": ref("BatchResult")}},
    },
    "Attempt": {
        "type": "object",
        "required": ["runId", "attempt", "status", "worker", "scheduledAt", "startedAt",
                     "endedAt", "durationMs", "error", "result"],
        "properties": {
            "runId": {"type": "string"}, "attempt": {"type": "integer"},
            "status": {"type": "string", "description": "succeeded, failed, timed_out, "
                       "abandoned, cancelled (stopped by overlap cancelPrevious); dispatched, "
                       "running, retry_wait or waiting (for its limit key: error says "
                       "'waiting for limit <name>') while in flight; from the archive also skipped "
                       "(a missed occurrence, attempt 0) and dead"},
            "worker": _n("string"), "scheduledAt": NTIME, "startedAt": NTIME, "endedAt": NTIME,
            "durationMs": _n("integer"), "error": _n("string"), "result": {},
            # Only when the API reads the run-history archive (RSCHED_ARCHIVE_URL):
            "jobId": {"type": "string"}, "type": _n("string"), "queue": _n("string"),
            "replays": {"type": "integer", "description": "Dead-letter replays of the run "
                        "before this attempt (attempts restart at 1 after a replay)."},
            "deadLettered": {"type": "boolean"}, "dispatchedAt": NTIME,
            "retryAt": {**NTIME, "description": "When the next attempt was due after this one."},
            "archived": {"type": "boolean", "description": "Read from the archive (false: its "
                         "events are still only in Redis)."},
        },
    },
    "RunPage": {
        "type": "object", "required": ["runs", "nextCursor"],
        "description": "With an archive configured: every attempt ever made (archived or "
                       "still in Redis, each once; skipped occurrences as attempt 0 with status "
                       "skipped), and partial. Without: Redis's bounded history.",
        "properties": {"runs": {"type": "array", "items": ref("Attempt")},
                       "nextCursor": _n("string"),
                       "partial": {"type": "boolean", "description": "More events wait in "
                                   "Redis than one read scans: older attempts may be missing."}},
    },
    "Failure": {
        "type": "object",
        "required": ["jobId", "runId", "attempt", "status", "at", "scheduledAt", "type", "queue",
                     "worker", "durationMs", "error"],
        "properties": {
            "jobId": _n("string"), "runId": _n("string"), "attempt": _n("integer"),
            "status": {"type": "string", "enum": ["failed", "timed_out", "abandoned"]},
            "at": NTIME, "scheduledAt": NTIME, "type": _n("string"), "queue": _n("string"),
            "worker": _n("string"), "durationMs": _n("integer"), "error": _n("string"),
        },
    },
    "FailurePage": {
        "type": "object", "required": ["failures", "nextCursor", "type", "from", "to"],
        "properties": {"failures": {"type": "array", "items": ref("Failure")},
                       "nextCursor": _n("string"), "type": _n("string"), "from": TIME,
                       "to": NTIME},
    },
    "DurationStats": {
        "type": "object", "required": ["type", "count", "failed", "meanMs", "maxMs",
                                       "percentiles"],
        "properties": {
            "type": {"type": "string"},
            "count": {"type": "integer", "description": "Finished attempts with a duration."},
            "failed": {"type": "integer", "description": "Of which failed or timed out."},
            "meanMs": {"type": "number"}, "maxMs": {"type": "integer"},
            "percentiles": {"type": "object", "required": ["p50", "p90", "p95", "p99"],
                            "description": "Nearest-rank duration percentiles in ms.",
                            "properties": {q: {"type": "integer"}
                                           for q in ("p50", "p90", "p95", "p99")}},
        },
    },
    "DurationReport": {
        "type": "object", "required": ["type", "from", "to", "types"],
        "properties": {"type": _n("string"), "from": TIME, "to": NTIME,
                       "types": {"type": "array", "items": ref("DurationStats")}},
    },
    "Run": {
        "type": "object",
        "required": ["runId", "jobId", "type", "queue", "status", "attempt", "worker",
                     "scheduledAt", "dispatchedAt", "startedAt", "endedAt", "durationMs",
                     "error", "result"],
        "properties": {
            "runId": {"type": "string"}, "jobId": {"type": "string"}, "type": {"type": "string"},
            "queue": {"type": "string"}, "status": {"type": "string"},
            "attempt": {"type": "integer"}, "worker": _n("string"), "scheduledAt": NTIME,
            "dispatchedAt": NTIME, "startedAt": NTIME, "endedAt": NTIME,
            "durationMs": _n("integer"), "error": _n("string"), "result": {},
            "jobVersion": _n("integer", description="The job's version when this run was "
                                                    "dispatched (null: a one-off job's own "
                                                    "run, which runs at the job's version)."),
            "waitingFor": _n("string", description="Status waiting: the limit definition "
                                                   "that holds the run (waiting for limit "
                                                   "<name>); no attempt is spent meanwhile."),
            "progress": {"type": ["object", "null"],
                         "description": "What the handler last reported (ctx.progress): "
                                        "value (0-100 or a JSON object), message, at.",
                         "properties": {"value": {}, "message": _n("string"), "at": NTIME}},
        },
    },
    "LimitBody": {
        "type": "object", "additionalProperties": False,
        "description": "A limit on the runs of a limit key: at most concurrency at once, and "
                       "at most rate.limit starts in any window of rate.periodSeconds (a "
                       "sliding window on Redis's clock). Give one or both.",
        "properties": {
            "concurrency": _n("integer", minimum=1, maximum=1_000_000),
            "rate": {"type": ["object", "null"], "additionalProperties": False,
                     "required": ["limit", "periodSeconds"],
                     "properties": {
                         "limit": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
                         "periodSeconds": {"type": "number", "exclusiveMinimum": 0,
                                           "maximum": 86400}}},
        },
    },
    "Limit": {
        "type": "object", "required": ["name", "concurrency", "rate"],
        "properties": {
            "name": {"type": "string", "description": "A key, or a family (ends in '*': each "
                                                      "key starting with what precedes it, "
                                                      "counted on its own)."},
            "concurrency": _n("integer"),
            "rate": {"type": ["object", "null"],
                     "properties": {"limit": {"type": "integer"},
                                    "periodSeconds": {"type": "number"}}},
            "inFlight": {"type": "integer", "description": "GET of a key's own name: runs "
                                                           "holding a slot now."},
            "waiting": {"type": "integer", "description": "GET of a key's own name: runs "
                                                          "waiting for a slot or the rate."},
            "busiestKeys": {
                "type": "array", "items": ref("BusyKey"),
                "description": "GET of a name, or GET /limits?busiest=N: the definition's "
                               "busiest keys (of a key's own, the key itself while busy), most "
                               "runs in flight and waiting first, then most recent starts."},
        },
    },
    "QueueLimit": {
        "type": "object", "required": ["queue", "concurrency", "rate"],
        "properties": {
            "queue": {"type": "string"},
            "concurrency": _n("integer"),
            "rate": {"type": ["object", "null"],
                     "properties": {"limit": {"type": "integer"},
                                    "periodSeconds": {"type": "number"}}},
            "inFlight": {"type": "integer", "description": "GET: permits held now (runs of "
                                                           "the queue running, and permits "
                                                           "reserved for woken waiting runs)."},
            "waiting": {"type": "integer", "description": "GET: runs waiting for a permit."},
        },
    },
    "BusyKey": {
        "type": "object", "required": ["key", "inFlight", "waiting", "recentStarts"],
        "properties": {
            "key": {"type": "string"},
            "inFlight": {"type": "integer", "description": "Runs holding a slot now."},
            "waiting": {"type": "integer", "description": "Runs waiting for it now."},
            "recentStarts": {"type": "integer", "description": "Starts in the rate's window "
                                                               "now (0 without a rate)."},
        },
    },
    "LimitPage": {
        "type": "object", "required": ["limits", "nextCursor"],
        "properties": {"limits": {"type": "array", "items": ref("Limit")},
                       "nextCursor": _n("string")},
    },
    "DeadLetter": {"allOf": [ref("Run"), {"type": "object", "required": ["deadAt"],
                                            "properties": {"deadAt": NTIME}}]},
    "DeadLetterPage": {
        "type": "object", "required": ["deadLetters", "nextCursor"],
        "properties": {"deadLetters": {"type": "array", "items": ref("DeadLetter")},
                       "nextCursor": _n("string")},
    },
    "OverviewHistory": {
        "type": "object", "required": ["sampleSeconds", "samples"],
        "properties": {"sampleSeconds": {"type": "number"}, "samples": {"type": "array", "items": {
            "type": "object", "required": ["t", "started", "succeeded", "failed", "lag", "due",
                                           "retry", "oldest"],
            "description": "Cumulative counters of the bucket starting at t (ms since the "
                           "epoch), read at at: rates are the differences of consecutive "
                           "samples over their at; lag is [upper bound in seconds (null: "
                           "+Inf), cumulative count] per start-lag bucket.",
            "properties": {"t": {"type": "integer"}, "at": {"type": "integer"},
                           "started": {"type": "number"},
                           "succeeded": {"type": "number"}, "failed": {"type": "number"},
                           "lag": {"type": "array", "items": {"type": "array"}},
                           "due": {"type": "integer"}, "retry": {"type": "integer"},
                           "oldest": {"type": "number"}}}}},
    },
    "PurgeRequest": {
        "type": "object", "additionalProperties": False, "required": ["dryRun"],
        "description": "Which dead letters to purge: each field given must match; none (or "
                       "null) matches all.",
        "properties": {
            "type": _n("string", pattern=TYPE_PATTERN),
            "queue": _n("string", pattern=QUEUE_PATTERN),
            "errorContains": _n("string", minLength=1, maxLength=1000,
                                description="Case-insensitive substring of the last error."),
            "olderThanSeconds": _n("number", minimum=0, maximum=3153600000),
            "dryRun": {"type": "boolean", "description": "true: only count the matches."},
        },
    },
    "Operation": {
        "type": "object",
        "required": ["id", "kind", "status", "dryRun", "filter", "createdAt", "updatedAt",
                     "endedAt", "total", "scanned", "matched", "deleted", "who", "error",
                     "cancelledBy"],
        "description": "A background operation: a purge of dead letters or its dry run, worked "
                       "through in chunks; resumed by another API process if its own stops.",
        "properties": {
            "id": {"type": "string"},
            "kind": {"type": "string", "enum": ["purgeDeadLetters"]},
            "status": {"type": "string",
                       "enum": ["running", "succeeded", "failed", "cancelled"]},
            "dryRun": {"type": "boolean"},
            "filter": {"type": "object", "description": "The purge request's filter fields."},
            "createdAt": TIME, "updatedAt": NTIME, "endedAt": NTIME,
            "total": {"type": "integer", "description": "Dead letters within the age bound "
                                                        "when it started."},
            "scanned": {"type": "integer", "description": "Dead letters read so far."},
            "matched": {"type": "integer", "description": "Of those, how many the filter "
                                                          "matched (a dry run's count)."},
            "deleted": {"type": "integer", "description": "How many were deleted."},
            "who": {"type": "string"}, "error": _n("string"), "cancelledBy": _n("string"),
        },
    },
    "OperationPage": {
        "type": "object", "required": ["operations", "nextCursor"],
        "properties": {"operations": {"type": "array", "items": ref("Operation")},
                       "nextCursor": _n("string")},
    },
    "BackfillRequest": {
        "type": "object", "additionalProperties": False, "required": ["from", "to"],
        "description": "Run each occurrence of the job's schedule in [from, to) that has no "
                       "run yet (at most 10,000), with its nominal time, under the "
                       "backfill's overlap policy; to may not be in the future.",
        "properties": {
            "from": {**TIME, "description": "Start (inclusive)."},
            "to": {**TIME, "description": "End (exclusive), not after now."},
            "dryRun": {"type": "boolean", "description": "true: write nothing, answer what "
                                                         "a backfill would do now (default "
                                                         "false)."},
            "overlap": {"type": "string", "enum": [o.value for o in BackfillOverlap],
                        "default": defaults.BACKFILL_OVERLAP,
                        "description": "The backfill's overlap policy: bufferAll (default) "
                                       "runs its occurrences one after another, the first "
                                       "once the job's active run has ended; the job's "
                                       "policies decide each against the job's active run."},
        },
    },
    "Backfill": {
        "type": "object",
        "required": ["jobId", "from", "to", "dryRun", "overlap", "count", "times", "counts",
                     "queued", "alreadyRun", "skipped", "buffered"],
        "description": "The range's occurrences and what became of each (a dry run: what "
                       "would become of each now, decided as a backfill does, nothing "
                       "written): queued to run now, alreadyRun (a run of it existed: not "
                       "run again), skipped or buffered by the overlap policy; counts has "
                       "the size of each list.",
        "properties": {
            "jobId": {"type": "string"}, "from": TIME, "to": TIME, "dryRun": {"type": "boolean"},
            "overlap": {"type": "string", "enum": [o.value for o in BackfillOverlap]},
            "count": {"type": "integer"},
            "counts": {
                "type": "object", "additionalProperties": False,
                "required": ["queued", "alreadyRun", "skipped", "buffered"],
                "properties": {name: {"type": "integer", "minimum": 0}
                               for name in ("queued", "alreadyRun", "skipped", "buffered")},
            },
            **{name: {"type": "array", "items": TIME}
               for name in ("times", "queued", "alreadyRun", "skipped", "buffered")},
        },
    },
    "Trigger": {
        "type": "object", "required": ["jobId", "runId"],
        "properties": {"jobId": {"type": "string"}, "runId": {"type": "string"}},
    },
    "Preview": {
        "type": "object", "required": ["cron", "timeZone", "times"],
        "properties": {
            "cron": {"type": "string"}, "timeZone": {"type": "string"},
            "times": {"type": "array", "items": {
                "type": "object", "required": ["utc", "local"],
                "properties": {"utc": TIME, "local": {"type": "string",
                                                      "description": "ISO-8601 with offset"},
                               "skipped": {"type": "string",
                                           "enum": ["beforeStartAt", "afterEndAt",
                                                    "beyondMaxRuns"],
                                           "description": "With jobId: why the job's "
                                                          "policies would not run it."}},
            }},
            "jobId": {"type": "string"},
        },
    },
    "MemoryProjection": {
        "type": "object",
        "required": ["parts"],
        "properties": {"parts": {"type": "array", "items": {
            "type": "object",
            "required": ["part", "bytes", "how"],
            "properties": {
                "part": {"type": "string", "enum": ["scheduled", "finished", "events",
                                                    "dead letters", "total"]},
                "bytes": {"type": "integer", "minimum": 0},
                "how": {"type": "string", "description": "How the bytes were reckoned."},
            },
        }}},
    },
    "Status": {
        "type": "object",
        "required": ["now", "partitions", "dispatchers", "workers", "queues", "dueBacklog",
                     "deadLetters"],
        "properties": {
            "now": TIME,
            "partitions": {"type": "array", "items": {
                "type": "object",
                "required": ["partition", "owner", "leaseExpiresAt", "fence", "dueBacklog",
                             "retryBacklog", "oldestDueAgeMs", "deadLetters"],
                "properties": {
                    "partition": {"type": "integer"}, "owner": _n("string"),
                    "leaseExpiresAt": NTIME, "fence": {"type": "integer"},
                    "dueBacklog": {"type": "integer"}, "retryBacklog": {"type": "integer"},
                    "oldestDueAgeMs": {"type": "integer"}, "deadLetters": {"type": "integer"},
                },
            }},
            "dispatchers": {"type": "array", "items": {
                "type": "object", "required": ["id", "expiresAt", "partitions"],
                "properties": {"id": {"type": "string"}, "expiresAt": NTIME,
                               "partitions": {"type": "array", "items": {"type": "integer"}}},
            }},
            "workers": {"type": "array", "items": {
                "type": "object",
                "required": ["id", "queues", "inflight", "lastHeartbeatAt", "alive",
                             "deadSince"],
                "properties": {
                    "id": {"type": "string"},
                    "queues": {"type": "array", "items": {"type": "string"}},
                    "inflight": {"type": "integer"}, "concurrency": {"type": "integer"},
                    "host": {"type": "string"}, "pid": {"type": "integer"},
                    "lastHeartbeatAt": NTIME,
                    "alive": {"type": "boolean", "description": "Heard from within its "
                              "--dead-after (its process heartbeat): a dead worker's runs go to "
                              "other workers."},
                    "deadSince": {**NTIME, "description": "Not alive: when its heartbeats "
                                  "stopped counting (the record is dropped "
                                  f"{defaults.WORKER_FORGET_MS // 1000} s later)."},
                },
            }},
            "queues": {"type": "array", "items": {
                "type": "object",
                "required": ["queue", "length", "pending", "liveWorkers", "unserved"],
                "properties": {"queue": {"type": "string"}, "length": {"type": "integer"},
                               "pending": {"type": "integer"},
                               "liveWorkers": {"type": "integer"},
                               "unserved": {"type": "boolean", "description": "Runs wait in "
                                            "it and no live worker reads it."}},
            }},
            "waitingForHandler": {
                "type": "array",
                "description": "Runs that workers without their job type's handler set aside "
                               "on a queue, waiting for a worker that has it; served: a live "
                               "worker with the handler reads the queue.",
                "items": {
                    "type": "object", "required": ["queue", "type", "runs", "served"],
                    "properties": {"queue": {"type": "string"}, "type": {"type": "string"},
                                   "runs": {"type": "integer"},
                                   "served": {"type": "boolean"}},
                }},
            "dueBacklog": {"type": "integer"}, "deadLetters": {"type": "integer"},
        },
    },
    "Check": {
        "type": "object", "required": ["check", "level", "message"],
        "properties": {"check": {"type": "string"},
                       "level": {"type": "string", "enum": ["ok", "warn", "fail"]},
                       "message": {"type": "string"}},
    },
    "Ready": {
        "type": "object", "required": ["status", "checks"],
        "properties": {"status": {"type": "string"},
                       "checks": {"type": "array", "items": ref("Check")}},
    },
    "Health": {"type": "object", "required": ["status"],
               "properties": {"status": {"type": "string"}}},
    "ApiKey": {
        "type": "object", "required": ["id", "name", "scope", "createdAt"],
        "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                       "scope": {"type": "string", "enum": ["read", "write", "admin"]},
                       "createdAt": NTIME},
    },
    "ApiKeyCreate": {
        "type": "object", "additionalProperties": False, "required": ["name", "scope"],
        "properties": {"name": {"type": "string", "pattern": KEY_NAME_PATTERN},
                       "scope": {"type": "string", "enum": ["read", "write", "admin"]}},
    },
    "ApiKeyCreated": {
        "type": "object", "required": ["key", "secret"],
        "properties": {"key": ref("ApiKey"),
                       "secret": {"type": "string", "description": "Shown once."}},
    },
    "ApiKeyOne": {"type": "object", "required": ["key"], "properties": {"key": ref("ApiKey")}},
    "ApiKeyList": {
        "type": "object", "required": ["keys"],
        "properties": {"keys": {"type": "array", "items": ref("ApiKey")}},
    },
    "Problem": {
        "type": "object", "required": ["type", "title", "status", "detail"],
        "description": "RFC 9457 problem details; errors name the offending field.",
        "properties": {
            "type": {"type": "string"}, "title": {"type": "string"},
            "status": {"type": "integer"}, "detail": {"type": "string"},
            "errors": {"type": "array", "items": {
                "type": "object", "required": ["field", "reason"],
                "properties": {"field": {"type": "string"}, "reason": {"type": "string"}},
            }},
            "checks": {"type": "array", "items": ref("Check")},
        },
    },
}
