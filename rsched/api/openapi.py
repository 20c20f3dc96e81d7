"""The OpenAPI 3.1 document of the HTTP API, written by hand and served at /openapi.json.

tests/redis/test_api.py checks it against the route table and validates it; schemathesis generates
requests from it, so every bound stated here is one the API enforces (rsched.service.inputs,
rsched.core.spec).
The paths and their answers are here; the bodies' schemas in rsched.api.schemas.
"""

from __future__ import annotations

import copy
from typing import Any

from rsched.api.schemas import SCHEMAS, TIME, ref
from rsched.archive.store import SORTS
from rsched.core.models import JobStatus
from rsched.core.spec import QUEUE_PATTERN, TYPE_PATTERN
from rsched.service.dead_letters import MAX_AGE_S
from rsched.service.last_runs import LAST_RUN_FILTERS

_ERRORS = {
    400: "Malformed JSON.", 401: "Missing, unknown or revoked API key.",
    403: "The API key's scope does not allow this.", 404: "No such job, run or key.",
    409: "Conflicts with the stored state.", 413: "Body or payload over the limit.",
    412: "The job is not at the If-Match version; nothing changed.",
    405: "Method not allowed here; Allow lists the methods.",
    422: "Invalid values; errors[].field names each.",
    415: "The body is not declared JSON (Content-Type application/json).",
    503: "Redis (or the run-history archive) is unavailable.",
    504: "Applied, but its replicas did not confirm it in time (RSCHED_WAIT_REPLICAS): it "
         "stands unless a failover undoes it. No Retry-After: retry only with the same "
         "Idempotency-Key (a schedule without one is made twice).",
}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": ref(schema)}}}


def _events(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"text/event-stream": {"schema": {"type": "string"}}}}


def _param(name: str, where: str, schema: dict[str, Any], description: str = "",
           required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "schema": schema, "description": description}


JOB_ID = _param("id", "path", {"type": "string"}, "Job id, e.g. 7-P7mwJFmG6o6nG_UFHP3")
LIMIT = _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000}, "Page size.")
LIMIT_NAME = _param("name", "path", {"type": "string", "minLength": 1, "maxLength": 200,
                                     "pattern": r"^[^*/\x00-\x1f\x7f-\x9f]*\*?$"},
                    "A limit key, or a family: a prefix ending in '*'.")
CURSOR = _param("cursor", "query", {"type": "string"}, "nextCursor of the previous page.")
QUEUE_NAME = _param("queue", "path", {"type": "string", "pattern": r"^[A-Za-z0-9_.\-]{1,64}$"},
                    "A queue's name.")
BUSIEST = _param("busiest", "query", {"type": "integer", "minimum": 0, "maximum": 100},
                 "Give each definition its busiestKeys, at most this many (0: none).")
LAST_EVENT_ID = _param("Last-Event-ID", "header", {"type": "string"},
                       "The id of the last event received: the stream resumes after it.")
IF_MATCH = _param("If-Match", "header", {"type": "string", "pattern": "^[0-9]{1,18}$"},
                  "Change the job only at this version (its `version`); else 412.")
IDEMPOTENCY_KEY = _param("Idempotency-Key", "header", {"type": "string", "minLength": 1,
                                                      "maxLength": 255},
                         "The job's idempotencyKey (Stripe's convention); both given and "
                         "different: 422.")
STATS_PARAMS = [
    _param("type", "query", {"type": "string", "pattern": TYPE_PATTERN}, "Only this job type."),
    _param("from", "query", TIME, "Start (inclusive), default 24 hours ago."),
    _param("to", "query", TIME, "End (exclusive), default none."),
]
DEAD_FILTER = [
    _param("type", "query", {"type": "string", "pattern": TYPE_PATTERN}, "Only this job type."),
    _param("queue", "query", {"type": "string", "pattern": QUEUE_PATTERN}, "Only this queue."),
    _param("errorContains", "query", {"type": "string", "minLength": 1, "maxLength": 1000},
           "Last error contains this (case-insensitive)."),
    _param("olderThanSeconds", "query", {"type": "number", "minimum": 0, "maximum": MAX_AGE_S},
           "Dead-lettered at least this long ago."),
]
NO_ARCHIVE = {"description": "No run-history archive is configured (RSCHED_ARCHIVE_URL).",
              "content": {"application/problem+json": {"schema": ref("Problem")}}}


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
                             "content": {"application/json": {"schema": ref(body)}}}
    return op


def _control(verb: str, summary: str, note: bool = False) -> dict[str, Any]:
    op = _op(f"{verb}Job", "jobs", summary, {200: _json("Job", "The job.")},
             [404, 409, 412], params=[JOB_ID, IF_MATCH], scope="write")
    if note:  # an optional body: the note kept with who and when
        op["requestBody"] = {"required": False,
                             "content": {"application/json": {"schema": ref("ControlNote")}}}
        for code in (400, 413, 422):
            op["responses"][str(code)] = {"$ref": f"#/components/responses/E{code}"}
    return {"post": op}


PATHS: dict[str, Any] = {
    "/jobs": {
        "post": _op("createJob", "jobs", "Schedule a job",
                    {201: _json("JobCreated", "Created."),
                     200: _json("JobCreated", "The job created earlier with this "
                                "idempotencyKey, or within this dedup window "
                                "(deduplicated true).")},
                    [409], params=[IDEMPOTENCY_KEY], body="JobCreate", scope="write"),
        "get": _op("listJobs", "jobs",
                   "List jobs: with a filter, q or sort, from the archive's job index (sorted, "
                   "keyset-paged, each page full until the last); otherwise, or with no archive, "
                   "by SCAN in no order",
                   {200: _json("JobPage", "A page of jobs; `indexed` says how it was read.")},
                   [422],
                   params=[
                       _param("status", "query",
                              {"type": "string", "enum": [s.value for s in JobStatus]}),
                       _param("type", "query", {"type": "string"}),
                       _param("queue", "query", {"type": "string"}),
                       _param("lastRun", "query", {"type": "string",
                                                   "enum": list(LAST_RUN_FILTERS)},
                              "The latest run's status (failed includes dead)."),
                       _param("q", "query", {"type": "string", "minLength": 1, "maxLength": 200},
                              "Jobs whose id, type or idempotency key starts with this (a "
                              "prefix, read from the job index: needs the archive)."),
                       _param("sort", "query", {"type": "string", "enum": list(SORTS)},
                              "nextRun (soonest first), created (newest first; the default) or "
                              "lastRun (latest first), job id breaking ties. Needs the archive: "
                              "without one the answer says indexed false, in no order."),
                       LIMIT, CURSOR]),
    },
    "/jobs/batch": {
        "post": _op("createJobs", "jobs", "Schedule up to 1,000 jobs",
                    {200: _json("BatchResponse", "One result per job, in order.")}, [],
                    body="BatchRequest", scope="write"),
    },
    "/jobs/{id}": {
        "get": _op("getJob", "jobs", "Get a job, with its latest run as the list shows it",
                   {200: _json("JobListed", "The job.")}, [404],
                   params=[JOB_ID]),
        "patch": _op("updateJob", "jobs", "Reschedule a job or change its payload, "
                     "maxAttempts, priority or lifecycle limits",
                     {200: _json("Job", "The updated job.")},
                     [404, 409, 412], params=[JOB_ID, IF_MATCH], body="JobPatch",
                     scope="write"),
    },
    "/jobs/{id}/pause": _control("pause", "Pause: no new runs; a run in progress finishes",
                                 note=True),
    "/jobs/{id}/resume": _control("resume", "Resume; a cron job's next run is computed from now",
                                  note=True),
    "/jobs/{id}/cancel": _control("cancel", "Cancel for good; a run in progress finishes"),
    "/jobs/{id}/trigger": {
        "post": _op("triggerJob", "jobs", "Run once now, outside the schedule",
                    {202: _json("Trigger", "The run was queued.")}, [404, 409],
                    params=[JOB_ID], scope="write"),
    },
    "/jobs/{id}/backfill": {
        "post": _op("backfillJob", "jobs", "Run a recurring job's past occurrences in a range, "
                    "each once", {200: _json("Backfill", "The occurrences and what became of "
                                                         "each (dryRun: what would).")},
                    [404, 409], params=[JOB_ID], body="BackfillRequest", scope="write"),
    },
    "/jobs/{id}/runs": {
        "get": _op("listRuns", "jobs", "Attempts of a job, newest first",
                   {200: _json("RunPage", "A page of attempts.")}, [404, 422],
                   params=[JOB_ID, LIMIT, CURSOR]),
    },
    "/jobs/{id}/events": {
        "get": _op("jobEvents", "events", "The job's events as Server-Sent Events, from now or "
                   "after Last-Event-ID (while the events stream still holds it)",
                   {200: _events("Each frame: `id`, `event` (its name) and `data`, an Event.")},
                   [404, 422], params=[JOB_ID, LAST_EVENT_ID]),
    },
    "/events": {
        "get": _op("events", "events", "Every job's events (of a queue, of a job type) as "
                   "Server-Sent Events, from now or after Last-Event-ID",
                   {200: _events("Each frame: `id`, `event` (its name) and `data`, an Event.")},
                   [422], params=[
                       _param("queue", "query", {"type": "string", "pattern": QUEUE_PATTERN}),
                       _param("type", "query", {"type": "string", "pattern": TYPE_PATTERN},
                              "Job type."),
                       LAST_EVENT_ID]),
    },
    "/runs/{runId}": {
        "get": _op("getRun", "runs", "A run; with wait, once it has ended (succeeded, dead, "
                   "cancelled, skipped, abandoned) or after that many seconds",
                   {200: _json("Run", "The run.")}, [404, 422], params=[
                       _param("runId", "path", {"type": "string"}),
                       _param("wait", "query", {"type": "number", "minimum": 0,
                                                "maximum": 60},
                              "Seconds to wait for the run to end (no busy polling).")]),
    },
    "/dead-letters": {
        "get": _op("listDeadLetters", "dead letters", "Dead-lettered runs, newest first",
                   {200: _json("DeadLetterPage", "A page of dead letters; with a filter, "
                               "the matches among the next `limit` (a page may be short).")},
                   [422], params=[LIMIT, CURSOR, *DEAD_FILTER]),
    },
    "/dead-letters/purge": {
        "post": _op("purgeDeadLetters", "dead letters", "Count (dryRun) or delete every dead "
                    "letter the filter matches, in the background; no filter field matches all",
                    {202: _json("Operation", "Started: follow it at its Location, "
                                "/operations/{operationId}.")},
                    [], body="PurgeRequest", scope="admin"),
    },
    "/operations": {
        "get": _op("listOperations", "background operations", "Background operations, newest first "
                   "(kept 7 days after they end)",
                   {200: _json("OperationPage", "A page of operations.")}, [422],
                   params=[LIMIT, CURSOR]),
    },
    "/operations/{operationId}": {
        "get": _op("getOperation", "background operations",
                   "A background operation and its progress",
                   {200: _json("Operation", "The operation.")}, [404],
                   params=[_param("operationId", "path", {"type": "string"})]),
    },
    "/operations/{operationId}/cancel": {
        "post": _op("cancelOperation", "background operations",
                    "Stop a running operation at its next chunk; what it did stays done",
                    {200: _json("Operation", "Cancelled.")}, [404, 409],
                    params=[_param("operationId", "path", {"type": "string"})],
                    scope="admin"),
    },
    "/dead-letters/{runId}": {
        "delete": _op("deleteDeadLetter", "dead letters", "Delete a dead letter for good "
                      "(recorded in the run's history)",
                      {204: {"description": "Deleted."}}, [404],
                      params=[_param("runId", "path", {"type": "string"})], scope="admin"),
    },
    "/dead-letters/{runId}/replay": {
        "post": _op("replayDeadLetter", "dead letters", "Replay: attempts counted from zero",
                    {200: _json("Run", "The run, waiting for its new first attempt (under "
                                "overlap bufferOne or cancelPrevious: buffered behind the job's "
                                "active run). 409 also when overlap skip holds it (another "
                                "run of the job is active).")},
                    [404, 409], params=[_param("runId", "path", {"type": "string"})],
                    scope="admin"),
    },
    "/schedules/preview": {
        "get": _op("previewSchedule", "schedules", "Next fire times of a cron expression",
                   {200: _json("Preview", "Fire times, DST rules applied.")}, [404, 422],
                   params=[
                       _param("cron", "query", {"type": "string"}, "e.g. 30 2 * * *; "
                              "required unless jobId is given"),
                       _param("jobId", "query", {"type": "string"}, "A job: its cron and zone, "
                              "each time marked when its startAt, endAt or maxRuns would skip "
                              "it"),
                       _param("timeZone", "query", {"type": "string"}, "IANA zone, default UTC"),
                       _param("from", "query", TIME, "Start (exclusive), default now"),
                       _param("count", "query", {"type": "integer", "minimum": 1,
                                                 "maximum": 100}, "default 5")]),
    },
    "/status": {
        "get": _op("getStatus", "operations", "Partitions, dispatchers, workers, queues",
                   {200: _json("Status", "The cluster's state.")}, []),
    },
    "/memory": {
        "get": _op("getMemory", "operations", "Projected Redis memory: the scheduled backlog, "
                   "finished jobs kept at the current rate, the events streams at their bound, "
                   "dead letters (docs/memory.md)",
                   {200: _json("MemoryProjection", "The projection's parts, the total last.")},
                   []),
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
    "/stats/overview": {
        "get": _op("overviewHistory", "stats", "The overview charts' history: samples of the "
                   "cluster's counters the API takes (RSCHED_STATS_SAMPLE_MS, default a minute)",
                   {200: _json("OverviewHistory", "Samples, oldest first.")}, [422],
                   params=[_param("minutes", "query", {"type": "integer", "minimum": 1,
                                                       "maximum": 120}, "default 60")]),
    },
    "/limits": {
        "get": _op("listLimits", "limits", "List limit definitions by name",
                   {200: _json("LimitPage", "A page of definitions.")}, [422],
                   params=[LIMIT, CURSOR, BUSIEST]),
    },
    "/limits/{name}": {
        "get": _op("getLimit", "limits", "A limit definition; a key's own with its inFlight "
                   "and waiting counts; its busiest keys",
                   {200: _json("Limit", "The definition.")}, [404, 422], params=[LIMIT_NAME]),
        "put": _op("putLimit", "limits", "Define or replace a limit; it applies within a "
                   "second to runs not yet started",
                   {200: _json("Limit", "The definition stored.")}, [],
                   params=[LIMIT_NAME], body="LimitBody", scope="write"),
        "delete": _op("deleteLimit", "limits", "Delete a limit; its keys' waiting runs start",
                      {204: {"description": "Deleted."}}, [404, 422], params=[LIMIT_NAME],
                      scope="write"),
    },
    "/queues/{queue}/limits": {
        "get": _op("getQueueLimit", "limits", "A queue's limit, with its runs in flight and "
                   "waiting", {200: _json("QueueLimit", "The limit.")}, [404, 422],
                   params=[QUEUE_NAME]),
        "put": _op("putQueueLimit", "limits", "Cap the whole queue (every worker and "
                   "dispatcher): concurrency and rate; it applies within a second",
                   {200: _json("QueueLimit", "The limit stored.")}, [],
                   params=[QUEUE_NAME], body="LimitBody", scope="write"),
        "delete": _op("deleteQueueLimit", "limits", "Delete a queue's limit; its waiting runs "
                      "start", {204: {"description": "Deleted."}}, [404, 422],
                      params=[QUEUE_NAME], scope="write"),
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
        "head": _op("healthzHead", "operations", "The process is up (no body)",
                    {200: {"description": "Up."}}, [], scope=None),
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
WAITING = {"createJob", "createJobs", "updateJob", "pauseJob", "resumeJob", "cancelJob",
           "triggerJob", "backfillJob", "replayDeadLetter", "createApiKey", "revokeApiKey"}
"""The operations whose writes wait for replicas (RSCHED_WAIT_REPLICAS): they may answer 504."""
for _ops in PATHS.values():
    for _op_doc in _ops.values():
        if _op_doc["operationId"] in WAITING:
            _op_doc["responses"]["504"] = {"$ref": "#/components/responses/E504"}


def document(*, auth: bool = True) -> dict[str, Any]:
    """The document; without auth, no security requirements (and no 401/403 answers)."""
    paths = copy.deepcopy(PATHS)
    for ops in paths.values():  # a body sent to any of them must be JSON (rsched.api.browser)
        for method in ("post", "patch"):
            if method in ops:
                ops[method]["responses"]["415"] = {"$ref": "#/components/responses/E415"}
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
                "application/problem+json": {"schema": ref("Problem")}}}
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
