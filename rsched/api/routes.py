"""The endpoints: each parses its input, calls the async service layer and shapes the answer.

Errors are raised, not returned: the guard in rsched.api.app turns every one into problem+json.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rsched.aclient import AsyncClient
from rsched.api.problems import (
    JSON,
    Problem,
    classify,
    idempotency_key,
    if_match,
    problem,
    problem_body,
    read_json,
)
from rsched.archive.history import check_page
from rsched.archive.stats import duration_stats, failures
from rsched.archive.store import Store, StoreUnavailable
from rsched.core import defaults
from rsched.core.errors import NotFound, ValidationError
from rsched.core.limits import limit_of
from rsched.core.spec import MAX_TIME_MS, TYPE_PATTERN
from rsched.core.times import to_ms
from rsched.service import apikeys, operations
from rsched.service import dead_letters as dead_letter_ops
from rsched.service import limits as limit_ops
from rsched.service.backfill import op_backfill
from rsched.service.doctor import judge, op_redis_facts
from rsched.service.inputs import (
    as_object,
    backfill_from_json,
    known_job_id,
    known_run_id,
    patch_from_json,
    reject_unknown,
    spec_from_json,
)
from rsched.service.job_listing import JobFilter, op_job_listing
from rsched.service.last_runs import op_last_runs
from rsched.service.listings import op_dead_letter_page
from rsched.service.memory import op_projection
from rsched.service.preview import fire_times, job_fire_times
from rsched.service.samples import op_samples
from rsched.service.shapes import (
    backfill_json,
    busy_key_json,
    created_json,
    dead_letter_json,
    durations_json,
    failures_json,
    finding_json,
    iso,
    job_json,
    key_json,
    last_run_json,
    limit_json,
    limit_view_json,
    listing_json,
    memory_json,
    operation_json,
    queue_limit_json,
    run_json,
    runs_json,
    status_json,
)
from rsched.service.status import op_status

MAX_BATCH = 1000
_INT = re.compile(r"-?[0-9]{1,18}")
_NUMBER = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?")
_TYPE = re.compile(TYPE_PATTERN)  # a job type, as POST /jobs accepts it
STATS_WINDOW_MS = 86_400_000  # /stats/* look back one day unless given ``from``
NO_ARCHIVE = ("no run-history archive is configured for this API: start it with "
              "RSCHED_ARCHIVE_URL=postgresql://... or sqlite:///path")


def _client(request: Request) -> AsyncClient:
    return request.app.state.client  # type: ignore[no-any-return]


def _limits(request: Request) -> Any:
    return request.app.state.limits


def int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _INT.fullmatch(raw):
        raise ValidationError(name, f"expected an integer, got {raw!r}")
    return int(raw)


def _job_id(request: Request) -> str:
    return known_job_id(request.path_params["id"])


# --- jobs --------------------------------------------------------------------------------------


async def create_job(request: Request) -> Response:
    spec = spec_from_json(await read_json(request, _limits(request).max_body_bytes))
    spec.idempotency_key = idempotency_key(request, spec.idempotency_key)
    job, created = await _client(request).schedule_spec(spec)
    return JSON(created_json(job), 201 if created else 200, {"Location": f"/jobs/{job.id}"})


async def create_batch(request: Request) -> Response:
    if "idempotency-key" in request.headers:  # one key cannot name many jobs
        raise ValidationError("Idempotency-Key", "applies to POST /jobs only: give each job "
                              "of a batch its own idempotencyKey")
    body = as_object(await read_json(request, _limits(request).max_batch_bytes), "body")
    reject_unknown(body, ("jobs",))
    items = body.get("jobs")
    if not isinstance(items, list):
        raise ValidationError("jobs", "required: an array of jobs")
    if len(items) > MAX_BATCH:
        raise ValidationError("jobs", f"at most {MAX_BATCH} jobs per request, got {len(items)}")
    results: list[dict[str, Any] | None] = [None] * len(items)
    specs, where = [], []
    for i, item in enumerate(items):
        try:
            # the field name is only formatted for an item that is no object (a cost per item)
            specs.append(spec_from_json(item) if type(item) is dict
                         else spec_from_json(item, f"jobs[{i}]"))
            where.append(i)
        except ValidationError as e:
            results[i] = _item_error(e, i)
    for i, res in zip(where, await _client(request).schedule_many(specs), strict=True):
        if isinstance(res, Exception):
            results[i] = _item_error(res, i)
        else:
            results[i] = {"status": 201 if res[1] else 200, "job": created_json(res[0])}
    return JSON({"results": results})


def _item_error(exc: Exception, index: int) -> dict[str, Any]:
    """A batch item's problem, each field it names prefixed with the item (``jobs[3].payload``)."""
    body = classify(exc)
    prefix = f"jobs[{index}]"
    for err in body.get("errors", ()):
        if err["field"] != prefix:  # an item that is no object is named so already
            err["field"] = f"{prefix}.{err['field']}"
    return {"status": body["status"], "error": body}


async def list_jobs(request: Request) -> Response:
    q = request.query_params
    flt = JobFilter(status=q.get("status"), type=q.get("type"), queue=q.get("queue"),
                    last_run=q.get("lastRun"), q=q.get("q"))
    try:
        page = await _client(request).run(op_job_listing(
            _client(request), flt, sort=q.get("sort"),
            limit=int_param(request, "limit", defaults.PAGE_LIMIT), cursor=q.get("cursor")))
    except StoreUnavailable as e:  # the job index is in the archive
        return _archive_down(e)
    return JSON(listing_json(page))


async def get_job(request: Request) -> Response:
    """The job with its latest run and failure streak, as the jobs list shows each job."""
    c = _client(request)
    job = await c.get(_job_id(request))
    (last,) = await c.run(op_last_runs([job]))
    return JSON(dict(job_json(job), lastRun=last_run_json(last)))


async def update_job(request: Request) -> Response:
    job_id = _job_id(request)
    patch = patch_from_json(await read_json(request, _limits(request).max_body_bytes))
    return JSON(job_json(await _client(request).update(job_id, patch,
                                                       if_match=if_match(request))))


async def _note(request: Request) -> str | None:
    """The optional body of pause and resume, ``{"note": ...}`` (no body: no note)."""
    if request.headers.get("content-length", "") in ("", "0") and \
            "chunked" not in request.headers.get("transfer-encoding", ""):
        return None
    body = as_object(await read_json(request, _limits(request).max_body_bytes), "body")
    reject_unknown(body, ("note",))
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise ValidationError("note", "expected a string")
    return note


async def pause_job(request: Request) -> Response:
    job_id, note = _job_id(request), await _note(request)
    return JSON(job_json(await _client(request).pause(
        job_id, if_match=if_match(request), note=note, by=_actor(request))))


async def resume_job(request: Request) -> Response:
    job_id, note = _job_id(request), await _note(request)
    return JSON(job_json(await _client(request).resume(
        job_id, if_match=if_match(request), note=note, by=_actor(request))))


async def cancel_job(request: Request) -> Response:
    return JSON(job_json(await _client(request).cancel(_job_id(request),
                                                       if_match=if_match(request))))


async def trigger_job(request: Request) -> Response:
    job_id = _job_id(request)
    run_id = await _client(request).trigger(job_id)
    return JSON({"jobId": job_id, "runId": run_id}, 202)


async def backfill_job(request: Request) -> Response:
    job_id = _job_id(request)
    from_ms, to_ms, dry, overlap = backfill_from_json(
        await read_json(request, _limits(request).max_body_bytes))
    c = _client(request)
    return JSON(backfill_json(await c.run(op_backfill(c, job_id, from_ms, to_ms, dry,
                                                      overlap))))


async def job_runs(request: Request) -> Response:
    """From the client's history source (rsched.service.history): the archive merged with
    Redis's events when one is configured, else Redis's bounded history."""
    c = _client(request)
    job_id, limit = _job_id(request), int_param(request, "limit", defaults.PAGE_LIMIT)
    cursor = request.query_params.get("cursor")
    try:
        return JSON(runs_json(await c.run(c.runs_source.op_page(job_id, limit, cursor))))
    except StoreUnavailable as e:
        return _archive_down(e)


# --- run statistics (the archive) ----------------------------------------------------------------


def _archive_down(e: StoreUnavailable) -> Response:
    return problem(503, f"the run-history archive is unavailable: {e}")


def _stats_query(request: Request) -> tuple[Store | None, str | None, int, int | None]:
    """(store, type, from ms, to ms) of a /stats request; ValidationError naming the parameter."""
    q = request.query_params
    job_type = q.get("type")
    if job_type is not None and not _TYPE.fullmatch(job_type):
        raise ValidationError("type", "not a job type (letters, digits and _.:- up to 128)")
    start, end = q.get("from"), q.get("to")
    hi = None if end is None else min(max(to_ms(end, "to"), 0), MAX_TIME_MS)
    lo = (int(time.time() * 1000) - STATS_WINDOW_MS if start is None
          else min(max(to_ms(start, "from"), 0), MAX_TIME_MS))
    if hi is not None and lo >= hi:
        raise ValidationError("from", "must be before to")
    return _client(request).archive, job_type, lo, hi


async def stats_failures(request: Request) -> Response:
    store, job_type, lo, hi = _stats_query(request)
    limit, cursor = int_param(request, "limit", 100), request.query_params.get("cursor")
    check_page(limit, cursor)
    if store is None:
        return problem(404, NO_ARCHIVE)
    try:
        page = await asyncio.to_thread(failures, store, job_type, lo, hi, limit, cursor)
    except StoreUnavailable as e:
        return _archive_down(e)
    return JSON(dict(failures_json(page), type=job_type, **{"from": iso(lo), "to": iso(hi)}))


async def stats_durations(request: Request) -> Response:
    store, job_type, lo, hi = _stats_query(request)
    if store is None:
        return problem(404, NO_ARCHIVE)
    try:
        stats = await asyncio.to_thread(duration_stats, store, lo, hi, job_type)
    except StoreUnavailable as e:
        return _archive_down(e)
    return JSON({"type": job_type, "from": iso(lo), "to": iso(hi), "types": durations_json(stats)})


async def stats_overview(request: Request) -> Response:
    """The overview charts' history: the API's samples of the last ``minutes`` (default 60)."""
    minutes = int_param(request, "minutes", 60)
    if not 1 <= minutes <= 120:
        raise ValidationError("minutes", "must be between 1 and 120")
    c = _client(request)
    now = await c.run(c.op_now())
    got = await c.run(op_samples(c, now - minutes * 60_000))
    return JSON({"sampleSeconds": c.settings.stats_sample_ms / 1000, "samples": got})


# --- dead letters ------------------------------------------------------------------------------


def _dead_filter(request: Request) -> dead_letter_ops.DeadFilter:
    """GET /dead-letters's filter: the purge body's fields as query parameters."""
    q = request.query_params
    age = q.get("olderThanSeconds")
    if age is not None and not _NUMBER.fullmatch(age):
        raise ValidationError("olderThanSeconds", f"expected a number of seconds, got {age!r}")
    return dead_letter_ops.DeadFilter(q.get("type"), q.get("queue"), q.get("errorContains"),
                          None if age is None else float(age))


def _actor(request: Request) -> str:
    """Who a deletion, pause or resume is recorded as: the API key's name and id, ``ops
    (key_4f2a...)``: names may repeat, ids do not (no key with auth off)."""
    key = getattr(request.state, "api_key", None)
    return f"{key.name} ({key.id})" if key is not None else "api (auth off)"


async def dead_letters(request: Request) -> Response:
    c = _client(request)
    limit = int_param(request, "limit", defaults.PAGE_LIMIT)
    page = await c.run(op_dead_letter_page(c, limit, request.query_params.get("cursor"),
                                                 _dead_filter(request)))
    return JSON({"deadLetters": [dead_letter_json(d) for d in page.items],
                 "nextCursor": page.next_cursor})


async def replay_dead_letter(request: Request) -> Response:
    run_id = known_run_id(request.path_params["runId"])
    return JSON(run_json(await _client(request).replay(run_id)))


async def delete_dead_letter(request: Request) -> Response:
    run_id = known_run_id(request.path_params["runId"])
    c = _client(request)
    (deleted,) = await c.run(dead_letter_ops.op_delete(c, [run_id], _actor(request)))
    if not deleted:
        raise NotFound("dead letter", run_id)
    return Response(status_code=204)


async def purge_dead_letters(request: Request) -> Response:
    body = as_object(await read_json(request, _limits(request).max_body_bytes), "body")
    reject_unknown(body, ("type", "queue", "errorContains", "olderThanSeconds", "dryRun"))
    dry = body.get("dryRun")
    if not isinstance(dry, bool):
        raise ValidationError("dryRun", "required: true to count the matches, false to delete")
    c = _client(request)
    flt = dead_letter_ops.filter_from_json(body)
    op = await c.run(operations.op_start_purge(c, flt, dry, _actor(request)))
    request.app.state.operations.start(op.id)
    return JSON(operation_json(op), status_code=202,
                headers={"Location": f"/operations/{op.id}"})


# --- background operations ---------------------------------------------------------------------


async def list_operations(request: Request) -> Response:
    limit = int_param(request, "limit", defaults.PAGE_LIMIT)
    ops, cursor = await _client(request).run(
        operations.op_list_operations(limit, request.query_params.get("cursor")))
    return JSON({"operations": [operation_json(o) for o in ops], "nextCursor": cursor})


async def get_operation(request: Request) -> Response:
    op_id = operations.check_operation_id(request.path_params["operationId"])
    return JSON(operation_json(await _client(request).run(operations.op_get_operation(op_id))))


async def cancel_operation(request: Request) -> Response:
    op_id = operations.check_operation_id(request.path_params["operationId"])
    op = await _client(request).run(operations.op_cancel_operation(op_id, _actor(request)))
    return JSON(operation_json(op))


# --- schedules, status, health -----------------------------------------------------------------


async def preview(request: Request) -> Response:
    q = request.query_params
    start = q.get("from")
    from_ms = int(time.time() * 1000) if start is None else to_ms(start, "from")
    count = int_param(request, "count", 5)
    job_id = q.get("jobId")
    if job_id is not None:
        for name in ("cron", "timeZone"):
            if name in q:
                raise ValidationError(name, "give either jobId or cron and timeZone")
        job = await _client(request).get(known_job_id(job_id))
        return JSON({"cron": job.cron, "timeZone": job.tz, "jobId": job.id,
                     "times": job_fire_times(job, from_ms, count)})
    tz = q.get("timeZone", "UTC")
    times = fire_times(q.get("cron"), tz, from_ms, count)
    return JSON({"cron": q.get("cron"), "timeZone": tz, "times": times})


async def status(request: Request) -> Response:
    c = _client(request)
    return JSON(status_json(await c.run(op_status(c))))


async def memory(request: Request) -> Response:
    """Projected Redis memory (rsched.service.memory): what `rsched doctor` lists."""
    c = _client(request)
    return JSON(memory_json(await c.run(op_projection(c, await c.run(c.op_partitions())))))


async def healthz(request: Request) -> Response:
    return JSON({"status": "ok"})


async def healthz_head(request: Request) -> Response:
    """HEAD /healthz, what load balancers send: GET's status and headers, no body."""
    res = await healthz(request)
    return Response(None, res.status_code, dict(res.headers))


async def readyz(request: Request) -> Response:
    c = _client(request)
    try:
        await c.r.ping()
        facts = await c.run(op_redis_facts())
    except Exception as e:  # noqa: BLE001 - any failure to reach Redis means not ready
        body = problem_body(503, f"Redis is unreachable: {e}")
        return Problem(dict(body, checks=[]), 503)
    findings = judge(facts, c.settings.partitions)
    checks = [finding_json(f) for f in findings]
    failed = [f for f in findings if f.level == "fail"]
    if failed:
        body = problem_body(503, "; ".join(f"{f.check}: {f.message}" for f in failed))
        return Problem(dict(body, checks=checks), 503)
    return JSON({"status": "ready", "checks": checks})


# --- limits ------------------------------------------------------------------------------------


async def list_limits(request: Request) -> Response:
    c = _client(request)
    page = await c.run(limit_ops.op_list_limits(
        int_param(request, "limit", defaults.PAGE_LIMIT), request.query_params.get("cursor")))
    items = [limit_json(lim) for lim in page.items]
    n = int_param(request, "busiest", 0)
    if n or "busiest" in request.query_params:  # ?busiest=N: each item's N busiest keys
        by_name = await c.run(limit_ops.op_busiest_keys(c, n))
        for item in items:
            item["busiestKeys"] = [busy_key_json(k) for k in by_name.get(item["name"], ())]
    return JSON({"limits": items, "nextCursor": page.next_cursor})


async def get_limit(request: Request) -> Response:
    c = _client(request)
    return JSON(limit_view_json(await c.run(limit_ops.op_get_limit(
        c, request.path_params["name"]))))


async def put_limit(request: Request) -> Response:
    name = request.path_params["name"]
    limit = limit_of(name, await read_json(request, _limits(request).max_body_bytes))
    c = _client(request)
    return JSON(limit_json(await c.run(limit_ops.op_set_limit(c, limit))))


async def delete_limit(request: Request) -> Response:
    c = _client(request)
    await c.run(limit_ops.op_delete_limit(c, request.path_params["name"]))
    return Response(status_code=204)


async def get_queue_limit(request: Request) -> Response:
    c = _client(request)
    return JSON(queue_limit_json(await c.run(limit_ops.op_get_queue_limit(
        c, request.path_params["queue"]))))


async def put_queue_limit(request: Request) -> Response:
    limit = limit_ops.queue_limit_of(request.path_params["queue"], await read_json(
        request, _limits(request).max_body_bytes))
    c = _client(request)
    stored = await c.run(limit_ops.op_set_queue_limit(c, limit))
    return JSON(queue_limit_json(limit_ops.LimitView(stored)))


async def delete_queue_limit(request: Request) -> Response:
    c = _client(request)
    await c.run(limit_ops.op_delete_queue_limit(c, request.path_params["queue"]))
    return Response(status_code=204)


# --- API keys ----------------------------------------------------------------------------------


async def list_keys(request: Request) -> Response:
    keys = await _client(request).run(apikeys.op_list_keys())
    return JSON({"keys": [key_json(k) for k in keys]})


async def create_key(request: Request) -> Response:
    body = as_object(await read_json(request, _limits(request).max_body_bytes), "body")
    reject_unknown(body, ("name", "scope"))
    key, secret = await _client(request).run(apikeys.op_create_key(body.get("name"),
                                                                body.get("scope")))
    return JSON({"key": key_json(key), "secret": secret}, 201)


async def revoke_key(request: Request) -> Response:
    key = await _client(request).run(apikeys.op_revoke_key(request.path_params["keyId"]))
    return JSON({"key": key_json(key)})
