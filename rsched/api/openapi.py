"""The OpenAPI 3.1 document of the HTTP API, written by hand and served at /openapi.json.

tests/test_api.py checks it against the route table and validates it; schemathesis generates
requests from it, so every bound stated here is one the API enforces (rsched.api.convert).
"""

from __future__ import annotations

import copy
from typing import Any

from rsched.core.models import JobStatus
from rsched.core.spec import QUEUE_PATTERN, TYPE_PATTERN

REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF + name}


def _n(t: str, **kw: Any) -> dict[str, Any]:
    """A nullable ``t``."""
    return {"type": [t, "null"], **kw}


TIME = {"type": "string", "format": "date-time"}
NTIME = _n("string", format="date-time")

SCHEMAS: dict[str, Any] = {
    "JobCreate": {
        "type": "object", "additionalProperties": False, "required": ["type"],
        "description": "A job to schedule: one-off at runAt (default now) or recurring on cron "
                       "in timeZone. null means the default.",
        "properties": {
            "type": {"type": "string", "pattern": TYPE_PATTERN,
                     "description": "Name of a handler registered in the workers' rsched.App."},
            "payload": {"description": "Any JSON value; at most 64 KiB once msgpack-encoded "
                                       "(configurable)."},
            "runAt": {**NTIME, "description": "When to run a one-off job; the past means now."},
            "cron": _n("string", description="5 fields, or 6 with seconds first."),
            "timeZone": _n("string", description="IANA zone for cron (default UTC)."),
            "queue": _n("string", pattern=QUEUE_PATTERN),
            "maxAttempts": _n("integer", minimum=1, maximum=1000),
            "idempotencyKey": _n("string", minLength=1, maxLength=255,
                                 description="The same key again returns the same job (200); "
                                             "with a different body it is a 409."),
            "priority": _n("integer", minimum=-1000, maximum=1000),
            "timeoutSeconds": _n("number", minimum=0.001, maximum=604800),
            "backoff": {
                "type": ["object", "null"], "additionalProperties": False,
                "properties": {
                    "baseSeconds": _n("number", minimum=0, maximum=86400),
                    "capSeconds": _n("number", minimum=0, maximum=2592000),
                },
            },
            "misfire": {"type": ["string", "null"], "enum": ["run_once", "skip", None]},
            "jitterSeconds": _n("number", minimum=0, maximum=86400),
            "paused": _n("boolean", description="Create the job paused."),
        },
    },
    "JobPatch": {
        "type": "object", "additionalProperties": False, "minProperties": 1,
        "description": "Reschedule (runAt, or cron and timeZone: the next run is computed "
                       "from now) or change the payload, maxAttempts or priority.",
        "properties": {
            "runAt": TIME, "cron": {"type": "string"}, "timeZone": {"type": "string"},
            "payload": {}, "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 1000},
            "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
        },
    },
    "Job": {
        "type": "object",
        "required": ["id", "type", "queue", "status", "payload", "runAt", "cron", "timeZone",
                     "nextRunAt", "maxAttempts", "backoff", "priority", "timeoutSeconds",
                     "idempotencyKey", "misfire", "jitterSeconds", "lastRunId", "createdAt",
                     "updatedAt"],
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
            "createdAt": TIME, "updatedAt": TIME,
        },
    },
    "JobPage": {
        "type": "object", "required": ["jobs", "nextCursor"],
        "properties": {"jobs": {"type": "array", "items": _ref("Job")},
                       "nextCursor": _n("string")},
    },
    "BatchRequest": {
        "type": "object", "additionalProperties": False, "required": ["jobs"],
        "properties": {"jobs": {
            "type": "array", "maxItems": 1000,
            "description": "Each item is a JobCreate, validated on its own: an invalid item gets "
                           "its own error in results and the others are still scheduled.",
            "items": {"anyOf": [_ref("JobCreate"), {}]},
        }},
    },
    "BatchResult": {
        "type": "object", "required": ["status"],
        "properties": {"status": {"type": "integer"}, "job": _ref("Job"),
                       "error": _ref("Problem")},
    },
    "BatchResponse": {
        "type": "object", "required": ["results"],
        "properties": {"results": {"type": "array", "items": _ref("BatchResult")}},
    },
    "Attempt": {
        "type": "object",
        "required": ["runId", "attempt", "status", "worker", "scheduledAt", "startedAt",
                     "endedAt", "durationMs", "error", "result"],
        "properties": {
            "runId": {"type": "string"}, "attempt": {"type": "integer"},
            "status": {"type": "string", "description": "succeeded, failed, timed_out, "
                       "abandoned; dispatched, running or retry_wait while in flight; from the "
                       "archive also skipped (a missed occurrence, attempt 0) and dead"},
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
        "properties": {"runs": {"type": "array", "items": _ref("Attempt")},
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
        "properties": {"failures": {"type": "array", "items": _ref("Failure")},
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
                       "types": {"type": "array", "items": _ref("DurationStats")}},
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
        },
    },
    "DeadLetter": {"allOf": [_ref("Run"), {"type": "object", "required": ["deadAt"],
                                            "properties": {"deadAt": NTIME}}]},
    "DeadLetterPage": {
        "type": "object", "required": ["deadLetters", "nextCursor"],
        "properties": {"deadLetters": {"type": "array", "items": _ref("DeadLetter")},
                       "nextCursor": _n("string")},
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
                                                      "description": "ISO-8601 with offset"}},
            }},
        },
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
                "required": ["id", "queues", "inflight", "lastHeartbeatAt", "alive"],
                "properties": {
                    "id": {"type": "string"},
                    "queues": {"type": "array", "items": {"type": "string"}},
                    "inflight": {"type": "integer"}, "concurrency": {"type": "integer"},
                    "host": {"type": "string"}, "pid": {"type": "integer"},
                    "lastHeartbeatAt": NTIME, "alive": {"type": "boolean"},
                },
            }},
            "queues": {"type": "array", "items": {
                "type": "object", "required": ["queue", "length", "pending"],
                "properties": {"queue": {"type": "string"}, "length": {"type": "integer"},
                               "pending": {"type": "integer"}},
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
                       "checks": {"type": "array", "items": _ref("Check")}},
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
        "properties": {"name": {"type": "string", "pattern": r"^[A-Za-z0-9_.:@\- ]{1,64}$"},
                       "scope": {"type": "string", "enum": ["read", "write", "admin"]}},
    },
    "ApiKeyCreated": {
        "type": "object", "required": ["key", "secret"],
        "properties": {"key": _ref("ApiKey"),
                       "secret": {"type": "string", "description": "Shown once."}},
    },
    "ApiKeyOne": {"type": "object", "required": ["key"], "properties": {"key": _ref("ApiKey")}},
    "ApiKeyList": {
        "type": "object", "required": ["keys"],
        "properties": {"keys": {"type": "array", "items": _ref("ApiKey")}},
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
            "checks": {"type": "array", "items": _ref("Check")},
        },
    },
}

_ERRORS = {
    400: "Malformed JSON.", 401: "Missing, unknown or revoked API key.",
    403: "The API key's scope does not allow this.", 404: "No such job, run or key.",
    409: "Conflicts with the stored state.", 413: "Body or payload over the limit.",
    405: "Method not allowed here; Allow lists the methods.",
    422: "Invalid values; errors[].field names each.",
    503: "Redis (or the run-history archive) is unavailable.",
}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema)}}}


def _param(name: str, where: str, schema: dict[str, Any], description: str = "",
           required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "schema": schema, "description": description}


JOB_ID = _param("id", "path", {"type": "string"}, "Job id, e.g. 7-01JD...")
LIMIT = _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000}, "Page size.")
CURSOR = _param("cursor", "query", {"type": "string"}, "nextCursor of the previous page.")
STATS_PARAMS = [
    _param("type", "query", {"type": "string", "pattern": TYPE_PATTERN}, "Only this job type."),
    _param("from", "query", TIME, "Start (inclusive), default 24 hours ago."),
    _param("to", "query", TIME, "End (exclusive), default none."),
]
NO_ARCHIVE = {"description": "No run-history archive is configured (RSCHED_ARCHIVE_URL).",
              "content": {"application/problem+json": {"schema": _ref("Problem")}}}


def _stats(op_id: str, summary: str, schema: str, description: str,
           params: list[dict[str, Any]]) -> dict[str, Any]:
    op = _op(op_id, "stats", summary, {200: _json(schema, description)}, [404, 422],
             params=params)
    op["responses"]["404"] = NO_ARCHIVE
    op["description"] = (op.get("description", "") + " From the run-history archive: events "
                         "reach it within the archiver's lag (seconds).").strip()
    return op


def _op(op_id: str, tag: str, summary: str, ok: dict[int, dict[str, Any]], errors: list[int],
        *, params: list[dict[str, Any]] | None = None, body: str | None = None,
        scope: str | None = "read") -> dict[str, Any]:
    responses: dict[str, Any] = {str(code): r for code, r in ok.items()}
    codes = list(errors)
    if scope is not None:
        codes += [401, 403]
    codes += [405, 503]
    if body is not None:
        codes += [400, 413, 422]
    for code in sorted(set(codes)):
        responses[str(code)] = {"$ref": f"#/components/responses/E{code}"}
    op: dict[str, Any] = {"operationId": op_id, "tags": [tag], "summary": summary,
                          "responses": responses}
    if scope is None:
        op["security"] = []
    else:
        op["description"] = f"Needs an API key with scope `{scope}` (or higher)."
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": _ref(body)}}}
    return op


def _control(verb: str, summary: str) -> dict[str, Any]:
    return {"post": _op(f"{verb}Job", "jobs", summary, {200: _json("Job", "The job.")},
                        [404, 409], params=[JOB_ID], scope="write")}


PATHS: dict[str, Any] = {
    "/jobs": {
        "post": _op("createJob", "jobs", "Schedule a job",
                    {201: _json("Job", "Created."),
                     200: _json("Job", "The job created earlier with this idempotencyKey.")},
                    [409], body="JobCreate", scope="write"),
        "get": _op("listJobs", "jobs", "List jobs (filtered, cursor-paginated; SCAN-based)",
                   {200: _json("JobPage", "A page of jobs, in no particular order.")}, [422],
                   params=[
                       _param("status", "query",
                              {"type": "string", "enum": [s.value for s in JobStatus]}),
                       _param("type", "query", {"type": "string"}),
                       _param("queue", "query", {"type": "string"}), LIMIT, CURSOR]),
    },
    "/jobs/batch": {
        "post": _op("createJobs", "jobs", "Schedule up to 1,000 jobs",
                    {200: _json("BatchResponse", "One result per job, in order.")}, [],
                    body="BatchRequest", scope="write"),
    },
    "/jobs/{id}": {
        "get": _op("getJob", "jobs", "Get a job", {200: _json("Job", "The job.")}, [404],
                   params=[JOB_ID]),
        "patch": _op("updateJob", "jobs", "Reschedule a job or change its payload, "
                     "maxAttempts or priority", {200: _json("Job", "The updated job.")},
                     [404, 409], params=[JOB_ID], body="JobPatch", scope="write"),
    },
    "/jobs/{id}/pause": _control("pause", "Pause: no new runs; a run in progress finishes"),
    "/jobs/{id}/resume": _control("resume", "Resume; a cron job's next run is computed from now"),
    "/jobs/{id}/cancel": _control("cancel", "Cancel for good; a run in progress finishes"),
    "/jobs/{id}/trigger": {
        "post": _op("triggerJob", "jobs", "Run once now, outside the schedule",
                    {202: _json("Trigger", "The run was queued.")}, [404, 409],
                    params=[JOB_ID], scope="write"),
    },
    "/jobs/{id}/runs": {
        "get": _op("listRuns", "jobs", "Attempts of a job, newest first",
                   {200: _json("RunPage", "A page of attempts.")}, [404, 422],
                   params=[JOB_ID, LIMIT, CURSOR]),
    },
    "/dead-letters": {
        "get": _op("listDeadLetters", "dead letters", "Dead-lettered runs, newest first",
                   {200: _json("DeadLetterPage", "A page of dead letters.")}, [422],
                   params=[LIMIT, CURSOR]),
    },
    "/dead-letters/{runId}/replay": {
        "post": _op("replayDeadLetter", "dead letters", "Replay: attempts counted from zero",
                    {200: _json("Run", "The run, waiting for its new first attempt.")},
                    [404, 409], params=[_param("runId", "path", {"type": "string"})],
                    scope="admin"),
    },
    "/schedules/preview": {
        "get": _op("previewSchedule", "schedules", "Next fire times of a cron expression",
                   {200: _json("Preview", "Fire times, DST rules applied.")}, [422], params=[
                       _param("cron", "query", {"type": "string"}, "e.g. 30 2 * * *",
                              required=True),
                       _param("timeZone", "query", {"type": "string"}, "IANA zone, default UTC"),
                       _param("from", "query", TIME, "Start (exclusive), default now"),
                       _param("count", "query", {"type": "integer", "minimum": 1,
                                                 "maximum": 100}, "default 5")]),
    },
    "/status": {
        "get": _op("getStatus", "operations", "Partitions, dispatchers, workers, queues",
                   {200: _json("Status", "The cluster's state.")}, []),
    },
    "/stats/failures": {
        "get": _stats("listFailures", "Failed, timed-out and abandoned attempts in a time "
                      "range, newest first", "FailurePage", "A page of failures.",
                      [*STATS_PARAMS, _param("limit", "query", {"type": "integer", "minimum": 1,
                                                                "maximum": 1000},
                                             "Page size, default 100."), CURSOR]),
    },
    "/stats/durations": {
        "get": _stats("durationStats", "Duration percentiles per job type in a time range",
                      "DurationReport", "One entry per job type with finished attempts.",
                      STATS_PARAMS),
    },
    "/api-keys": {
        "get": _op("listApiKeys", "keys", "List API keys (never their secrets)",
                   {200: _json("ApiKeyList", "The keys.")}, [], scope="admin"),
        "post": _op("createApiKey", "keys", "Create an API key; the secret is shown once",
                    {201: _json("ApiKeyCreated", "The key and its secret.")}, [],
                    body="ApiKeyCreate", scope="admin"),
    },
    "/api-keys/{keyId}": {
        "delete": _op("revokeApiKey", "keys", "Revoke an API key",
                      {200: _json("ApiKeyOne", "The revoked key.")}, [404, 409],
                      params=[_param("keyId", "path", {"type": "string"})], scope="admin"),
    },
    "/healthz": {
        "get": _op("healthz", "operations", "The process is up",
                   {200: _json("Health", "Up.")}, [], scope=None),
    },
    "/readyz": {
        "get": _op("readyz", "operations", "Redis reachable and correctly configured",
                   {200: _json("Ready", "Ready.")}, [], scope=None),
    },
    "/openapi.json": {
        "get": {"operationId": "openapi", "tags": ["operations"], "security": [],
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1",
                                      "content": {"application/json": {"schema": {}}}}}},
    },
    "/docs": {
        "get": {"operationId": "docs", "tags": ["operations"], "security": [],
                "summary": "Interactive documentation",
                "responses": {"200": {"description": "HTML",
                                      "content": {"text/html": {"schema": {"type": "string"}}}}}},
    },
}


def document(*, auth: bool = True) -> dict[str, Any]:
    """The document; without auth, no security requirements (and no 401/403 answers)."""
    paths = copy.deepcopy(PATHS)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "rsched", "version": "1", "description":
                 "Durable one-off and cron jobs on Redis. JSON bodies, camelCase fields, "
                 "times as ISO-8601 (UTC with Z in responses); errors are RFC 9457 "
                 "application/problem+json naming the field."},
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "responses": {f"E{code}": {"description": text, "content": {
                "application/problem+json": {"schema": _ref("Problem")}}}
                for code, text in _ERRORS.items()},
        },
    }
    if auth:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "An API key from `rsched keys create`."}}
        doc["security"] = [{"bearer": []}]
    else:
        for ops in paths.values():
            for op in ops.values():
                op.pop("security", None)
                op.pop("description", None)
                op.get("responses", {}).pop("401", None)
                op["responses"].pop("403", None)
    return doc
