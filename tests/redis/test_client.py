"""The Client (service layer) against a real redis-server: scheduling, idempotency, validation,
batch scheduling and the control calls that need no worker."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import pytest
import redis
from support.helpers import PARTITIONS, event_types, redis_now_ms, settings, smembers

from rsched import Client, Conflict, Job, JobSpec, JobStatus, NotFound, ValidationError
from rsched.aclient import AsyncClient
from rsched.core import defaults
from rsched.core import spec as spec_module
from rsched.core.cron import parse_cron
from rsched.core.errors import PayloadTooLarge, UnsafeRedis
from rsched.core.ids import partition_for_key
from rsched.core.layout import JB, OWN, J
from rsched.core.models import partition_of, run_fields, unpack_spec
from rsched.core.spec import check_ints, check_names, prepare, usual_fast
from rsched.rdb import keys, ops
from rsched.rdb.ops import Scripts
from rsched.service import scheduling
from rsched.service.listings import op_list_jobs
from rsched.service.patch import JobPatch


def job_keys(r: redis.Redis) -> list[bytes]:
    return sorted(r.scan_iter(match="rsched:{p*}:job:*", count=1000))


def due_count(r: redis.Redis) -> int:
    return sum(r.zcard(keys.due(p)) for p in range(PARTITIONS))


def queued_count(r: redis.Redis) -> int:
    return sum(r.xlen(keys.stream(p, "default")) for p in range(PARTITIONS))



# --- idempotency -------------------------------------------------------------------------------


def test_the_same_idempotency_key_twice_returns_the_same_job_and_creates_no_second(
    client: Client, r: redis.Redis
) -> None:
    run_at = redis_now_ms(r) + 3_600_000
    first = client.schedule("email", {"to": "a@x"}, run_at=run_at, idempotency_key="order-17")
    again = client.schedule("email", {"to": "a@x"}, run_at=run_at, idempotency_key="order-17")

    assert again.id == first.id
    assert again.created_ms == first.created_ms
    assert len(job_keys(r)) == 1
    assert due_count(r) == 1
    assert event_types(r, first.partition, first.id) == ["scheduled"]


def test_a_job_with_an_idempotency_key_lives_in_the_partition_derived_from_the_key(
    client: Client,
) -> None:
    for key in ("a", "order-17", "tenant/42/report"):
        job = client.schedule("report", idempotency_key=key)
        assert partition_of(job.id) == partition_for_key(key, PARTITIONS) == job.partition


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"to": "b@x"}},
        {"type": "sms"},
        {"queue": "bulk"},
        {"max_attempts": 7},
        {"priority": 3},
        {"run_at": "2031-01-01T00:00:00Z"},
        {"cron": "0 9 * * *", "run_at": None},
        {"paused": True},
    ],
    ids=lambda c: ",".join(c),
)
def test_the_same_idempotency_key_with_a_different_body_is_a_conflict_naming_idempotencyKey(
    client: Client, r: redis.Redis, change: dict[str, Any]
) -> None:
    base: dict[str, Any] = {
        "type": "email", "payload": {"to": "a@x"}, "run_at": "2030-01-01T00:00:00Z",
        "idempotency_key": "order-17",
    }
    original = client.schedule(**base)
    with pytest.raises(Conflict) as err:
        client.schedule(**{**base, **change})
    assert err.value.field == "idempotencyKey"
    assert len(job_keys(r)) == 1
    assert client.get(original.id) == original


def test_a_repeated_idempotency_key_inside_one_batch_yields_one_job_and_one_conflict(
    client: Client, r: redis.Redis
) -> None:
    out = client.schedule_many([
        JobSpec("email", {"n": 1}, idempotency_key="dup"),
        JobSpec("email", {"n": 1}, idempotency_key="dup"),
        JobSpec("email", {"n": 2}, idempotency_key="dup"),
    ])
    assert not isinstance(out[0], Exception) and not isinstance(out[1], Exception)
    assert out[0].id == out[1].id
    assert isinstance(out[2], Conflict) and out[2].field == "idempotencyKey"
    assert len(job_keys(r)) == 1


def test_a_schedule_pipeline_sent_twice_creates_each_job_once(
    client: Client, r: redis.Redis
) -> None:
    """redis-py resends a pipeline after a connection error: a job with a random id (no body
    hash stored) is recognized by its existence, one with a key by its body hash."""
    specs = [JobSpec("email", {"i": i}) for i in range(20)]
    specs.append(JobSpec("email", {"k": 1}, idempotency_key="order-18"))
    op = client.op_schedule_created(specs)
    work = next(op)
    while not isinstance(work, Scripts):
        work = op.send(ops.execute(client.r, work))
    work = Scripts(list(work.calls))  # built lazily: keep them to send twice
    first = ops.execute(client.r, work)
    again = ops.execute(client.r, work)
    assert [code for res in first for code in res[2:]] == [0] * len(specs)
    assert [code for res in again for code in res[2:]] == [1] * len(specs)
    try:
        while True:
            work = op.send(again)
            again = ops.execute(client.r, work)
    except StopIteration as done:
        out = done.value
    assert [(job.payload, created) for job, created in out] == [(s.payload, False) for s in specs]
    # Due now: each job went straight to its queue stream, once; none waits in a due set.
    assert queued_count(r) == len(job_keys(r)) == len(specs)
    assert due_count(r) == 0
    for job, _ in out:
        assert event_types(r, job.partition, job.id) == ["scheduled", "dispatched"]
        assert job.updated_ms == job.created_ms > 0


# --- batches -----------------------------------------------------------------------------------

INVALID_EVERY = 500
INVALID_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"type": "no spaces"}, "type"),
    ({"queue": "a/b"}, "queue"),
    ({"max_attempts": 0}, "maxAttempts"),
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "timeZone"),
    ({"run_at": "tomorrow"}, "runAt"),
    ({"priority": 10_000}, "priority"),
    ({"payload": b"x" * 70_000}, "payload"),
    ({"misfire": "later"}, "misfire"),
    ({"idempotency_key": ""}, "idempotencyKey"),
]


def test_a_batch_of_5000_jobs_returns_a_job_per_spec_in_order_with_errors_in_place(
    client: Client, r: redis.Redis
) -> None:
    n = 5000
    run_at = redis_now_ms(r) + 3_600_000
    specs = [JobSpec("bulk", {"i": i}, run_at=run_at + i) for i in range(n)]
    bad: dict[int, str] = {}
    for k, i in enumerate(range(7, n, INVALID_EVERY)):
        change, field = INVALID_SPECS[k % len(INVALID_SPECS)]
        specs[i] = JobSpec(**{"type": "bulk", "payload": {"i": i}, **change})
        bad[i] = field

    t0 = time.perf_counter()
    out = client.schedule_many(specs)
    elapsed = time.perf_counter() - t0

    assert len(out) == n
    for i, res in enumerate(out):
        if i in bad:
            assert isinstance(res, ValidationError), (i, res)
            assert res.field == bad[i], (i, res)
        else:
            assert not isinstance(res, Exception), (i, res)
            assert res.payload == {"i": i} and res.next_ms == run_at + i
    jobs = [j for j in out if not isinstance(j, Exception)]
    assert {j.partition for j in jobs} == set(range(PARTITIONS))
    assert len({j.id for j in jobs}) == len(jobs) == n - len(bad)
    assert len(job_keys(r)) == due_count(r) == len(jobs)
    print(f"schedule_many: {n} specs in {elapsed * 1000:.0f} ms")  # shown with -s
    assert elapsed < 10, f"5000 jobs took {elapsed:.1f} s"


def test_a_small_batch_lands_in_one_partition_and_batches_spread_over_all(
    client: Client,
) -> None:
    """One script call per small batch (coalesced single POSTs): its jobs share a partition,
    picked at random per batch."""
    batches = [client.schedule_many([JobSpec("email", {"i": i}) for i in range(20)])
               for _ in range(200)]
    picked: list[int] = []
    for batch in batches:
        parts = {job.partition for job in batch if not isinstance(job, Exception)}
        assert len(parts) == 1
        picked += parts
    assert set(picked) == set(range(PARTITIONS))


@pytest.mark.parametrize("n", [0, 1, 32, 64, 65, 250, 1000, 5000])
def test_a_batch_goes_in_calls_growing_from_a_small_first_one_to_equal_bounded_ones(
    n: int,
) -> None:
    """Streamed, Redis waits for the first call only: it is small, the next ones double (while
    Redis stores one, the client builds the next), then the rest split evenly under the bound.
    In one pipeline, the fewest calls under the bound: each costs Redis work of its own."""
    first, chunk = defaults.SCHEDULE_FIRST_CHUNK, defaults.SCHEDULE_CHUNK
    sizes = scheduling.call_sizes(n)
    assert sum(sizes) == n and all(0 < s <= chunk for s in sizes)
    if n <= 2 * first:
        assert sizes == ([n] if n else [])
    else:
        assert sizes[0] == first and sizes[1] > first
    steps = (chunk // first).bit_length()  # 32, 64, 128: then calls of up to 250
    assert len(sizes) <= steps + -(-n // chunk)
    if n >= 1000:
        assert sizes[:steps] == [first << k for k in range(steps)]
        assert max(sizes[steps:]) - min(sizes[steps:]) <= 1
    piped = scheduling.call_sizes(n, streamed=False)
    assert sum(piped) == n and len(piped) == -(-n // chunk)
    assert not piped or max(piped) - min(piped) <= 1


def test_only_a_client_that_streams_its_calls_starts_a_batch_with_small_ones(
    redis_url: str,
) -> None:
    plain = Client(settings=settings(redis_url))
    waiting = Client(settings=settings(redis_url, wait_replicas=1))
    try:
        assert plain.streams_calls and not waiting.streams_calls
        assert not AsyncClient(settings=settings(redis_url)).streams_calls
    finally:
        plain.r.close()
        waiting.r.close()


def vars_of(spec: JobSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in JobSpec.__slots__}


def test_a_batch_mixing_types_queues_and_states_stores_and_returns_each_job_as_given(
    client: Client, r: redis.Redis
) -> None:
    """A script call groups the jobs that share type, queue, status, attempts and cron: each
    result must still be the job of the spec at its place, stored as returned."""
    run_at = redis_now_ms(r) + 3_600_000
    specs = [
        JobSpec(("email", "sms", "report")[i % 3], {"i": i}, queue=("default", "bulk")[i % 2],
                max_attempts=1 + i % 4, paused=i % 5 == 0,
                idempotency_key=f"k{i}" if i % 11 == 0 else None,
                **({"cron": "0 9 * * *"} if i % 7 == 0 else {"run_at": run_at + i}))
        for i in range(600)
    ]
    # Some keys exist already: with the same body (found, not created) or another (conflict).
    before = client.schedule_many([JobSpec(**{**vars_of(specs[i]), "payload": (
        "other" if i % 22 == 0 else specs[i].payload)}) for i in range(0, 600, 11)])
    out = client.run(client.op_schedule_created(specs))
    for i, (spec, res) in enumerate(zip(specs, out, strict=True)):
        if i % 22 == 0:
            assert isinstance(res, Conflict), (i, res)
            continue
        assert not isinstance(res, Exception), (i, res)
        job, created = res
        assert created is (i % 11 != 0), i
        assert (job.type, job.queue, job.payload, job.max_attempts, job.cron) == (
            spec.type, spec.queue, spec.payload, spec.max_attempts, spec.cron)
        assert job.status is (JobStatus.PAUSED if spec.paused else JobStatus.SCHEDULED)
        assert client.get(job.id) == job
    assert not any(isinstance(b, Exception) for b in before)
    assert due_count(r) == sum(not s.paused for s in specs)  # a conflict's job is the earlier
    assert {q.decode() for p in range(PARTITIONS) for q in smembers(r, keys.queues(p))} == {
        "default", "bulk"}


def test_a_job_hash_leaves_out_its_id_an_empty_cron_and_the_defaults(
    client: Client, r: redis.Redis
) -> None:
    """The key holds the id, a random id its creation time, and readers fill in the rest (the
    default attempts, queue and status 'scheduled', a runAt), under core.layout's short names: a
    small job's hash is a listpack of at most 80 bytes, jemalloc's 80-byte class
    (docs/performance-history.md: memory per job)."""
    before = redis_now_ms(r)
    run_at = before + 3_600_000
    job = client.schedule("report.send", {"to": "user-1@example.com", "n": 1}, run_at=run_at)
    key = keys.job(job.partition, job.id)
    assert set(r.hgetall(key)) == {JB.type, JB.next_ms, JB.spec}
    assert r.object("encoding", key) == b"listpack"
    # MEMORY USAGE: the key's string (48), object (16), dict entry (24 -> 32 with the
    # allocator's rounding, counted as 24) and the listpack's size class.
    usage = r.memory_usage(key, samples=0)
    assert usage is not None and usage <= 48 + 16 + 24 + 80
    assert client.get(job.id) == job and job.max_attempts == defaults.MAX_ATTEMPTS
    assert job.cron is None
    assert before - 50 <= job.created_ms == job.updated_ms <= redis_now_ms(r) + 50
    keyed = client.schedule("t", run_at=run_at, idempotency_key="stored-created")
    stored = r.hget(keys.job(keyed.partition, keyed.id), J.created_ms)
    assert stored == str(keyed.created_ms).encode()
    assert client.get(keyed.id) == keyed
    five = client.schedule("t", max_attempts=5, run_at=run_at)
    assert r.hget(keys.job(five.partition, five.id), J.max_attempts) == b"5"
    # Back to the default by an update: stored as '' (or absent), read as the default.
    assert client.update(five.id, JobPatch(max_attempts=defaults.MAX_ATTEMPTS)).max_attempts == (
        defaults.MAX_ATTEMPTS)
    assert client.update(job.id, JobPatch(max_attempts=2)).max_attempts == 2
    assert client.get(job.id).max_attempts == 2



def test_a_queue_or_status_off_its_default_is_stored_and_read_back(
    client: Client, r: redis.Redis
) -> None:
    run_at = redis_now_ms(r) + 3_600_000
    bulk = client.schedule("t", queue="bulk", run_at=run_at)
    paused = client.schedule("t", paused=True, run_at=run_at)
    assert r.hget(keys.job(bulk.partition, bulk.id), J.queue) == b"bulk"
    assert r.hget(keys.job(paused.partition, paused.id), J.status) == b"paused"
    assert client.get(bulk.id).queue == "bulk" and client.get(paused.id).status is JobStatus.PAUSED
    # The listing's filters read absent fields as their defaults, too.
    def listed(status: str | None = None, queue: str | None = None) -> set[str]:
        return {j.id for j in client.run(op_list_jobs(status=status, queue=queue)).items}
    assert listed(status="scheduled") == {bulk.id} and listed(status="paused") == {paused.id}
    assert listed(queue=defaults.QUEUE) == {paused.id} and listed(queue="bulk") == {bulk.id}


def test_a_one_off_jobs_run_at_is_read_from_its_first_occurrence_through_its_life(
    client: Client, r: redis.Redis
) -> None:
    """The spec leaves a runAt out (models._LEFT_OUT): the job hash holds it as next_ms, then
    as its own run's time; a cancel keeps next_ms, an update after the first run stores it."""
    now = redis_now_ms(r)
    later = client.schedule("t", run_at=now + 3_600_000)
    assert unpack_spec(r.hget(keys.job(later.partition, later.id), J.spec))["run_at_ms"] is None
    assert client.get(later.id).run_at_ms == now + 3_600_000
    client.cancel(later.id)
    cancelled = client.get(later.id)
    assert cancelled.run_at_ms == now + 3_600_000 and cancelled.next_ms is None
    due = client.schedule("t", run_at=now - 5)  # due: straight to its queue (own run)
    key = keys.job(due.partition, due.id)
    assert r.hget(key, J.next_ms) == b"0"
    assert r.hget(key, J.own_run) == f"{due.id}@{now - 5}".encode()
    assert client.get(due.id).run_at_ms == now - 5
    moved = client.update(due.id, JobPatch(run_at=now + 60_000))
    assert moved.run_at_ms == now + 60_000 == client.get(due.id).run_at_ms
    assert unpack_spec(r.hget(key, J.spec))["run_at_ms"] == now + 60_000
    assert client.schedule("t").run_at_ms is None  # no runAt: none, not its creation time

# --- validation --------------------------------------------------------------------------------

VALIDATION_CASES: list[tuple[dict[str, Any], str]] = [
    ({"type": ""}, "type"),
    ({"type": "bad type!"}, "type"),
    ({"type": 5}, "type"),
    ({"type": "x" * 129}, "type"),
    ({"queue": "a/b"}, "queue"),
    ({"queue": ""}, "queue"),
    ({"payload": b"x" * 70_000}, "payload"),
    ({"payload": object()}, "payload"),
    ({"run_at": "tomorrow"}, "runAt"),
    ({"run_at": datetime(2030, 1, 1)}, "runAt"),
    ({"run_at": True}, "runAt"),
    ({"run_at": [2030]}, "runAt"),
    ({"run_at": -5}, "runAt"),
    ({"run_at": "2030-01-01T00:00:00Z", "cron": "0 9 * * *"}, "runAt"),
    ({"cron": ""}, "cron"),
    ({"cron": "* * *"}, "cron"),
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "0 0 30 2 *"}, "cron"),
    ({"cron": 5}, "cron"),
    ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "timeZone"),
    ({"tz": "Nowhere/Zone"}, "timeZone"),
    ({"max_attempts": 0}, "maxAttempts"),
    ({"max_attempts": "3"}, "maxAttempts"),
    ({"max_attempts": 1001}, "maxAttempts"),
    ({"priority": 5000}, "priority"),
    ({"timeout_ms": 0}, "timeoutSeconds"),
    ({"backoff_base_ms": -1}, "backoff.baseSeconds"),
    ({"backoff_cap_ms": 31 * 86_400_000}, "backoff.capSeconds"),
    ({"jitter_ms": -1}, "jitterSeconds"),
    ({"misfire": "later"}, "misfire"),
    ({"idempotency_key": ""}, "idempotencyKey"),
    ({"idempotency_key": "k" * 256}, "idempotencyKey"),
]


@pytest.mark.parametrize(
    ("change", "field"),
    VALIDATION_CASES,
    ids=[f"{f}-{i}" for i, (_, f) in enumerate(VALIDATION_CASES)],
)
def test_an_invalid_spec_is_rejected_with_an_error_naming_the_field_and_writes_nothing(
    client: Client, r: redis.Redis, change: dict[str, Any], field: str
) -> None:
    kwargs: dict[str, Any] = {"type": "email", "payload": {"to": "a@x"}, **change}
    with pytest.raises(ValidationError) as err:
        client.schedule(**kwargs)
    assert err.value.field == field
    assert err.value.reason and str(err.value).startswith(f"{field}: ")
    if field == "payload" and isinstance(change["payload"], bytes):
        assert isinstance(err.value, PayloadTooLarge)
    assert job_keys(r) == [] and due_count(r) == 0


def test_a_malformed_job_id_names_the_id_and_an_unknown_one_is_not_found(client: Client) -> None:
    with pytest.raises(ValidationError) as err:
        client.get("not-an-id")
    assert err.value.field == "id"
    with pytest.raises(NotFound):
        client.get("3-01ARZ3NDEKTSV4RRFFQ69G5FAV")
    with pytest.raises(NotFound):
        client.pause("3-01ARZ3NDEKTSV4RRFFQ69G5FAV")
    with pytest.raises(ValidationError) as err:
        client.replay("3-01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert err.value.field == "runId"


# --- partitions --------------------------------------------------------------------------------


def test_a_client_started_with_another_partition_count_refuses_to_schedule(
    client: Client, redis_url: str
) -> None:
    client.schedule("ping")  # stores the default count, 16
    other = Client(settings=settings(redis_url, partitions=8))
    try:
        with pytest.raises(UnsafeRedis, match="16 partitions, not 8"):
            other.schedule("ping")
    finally:
        other.close()


# --- pause, resume, cancel (no worker involved) ------------------------------------------------


def test_a_paused_job_leaves_the_due_set_and_resuming_a_cron_job_computes_its_next_run_from_now(
    client: Client, r: redis.Redis
) -> None:
    job = client.schedule("tick", cron="* * * * * *")  # every second (seconds field first)
    assert r.zscore(keys.due(job.partition), job.id) == job.next_ms

    paused = client.pause(job.id)
    assert paused.status is JobStatus.PAUSED
    assert r.zscore(keys.due(job.partition), job.id) is None
    assert client.pause(job.id).status is JobStatus.PAUSED  # pausing twice is harmless

    while redis_now_ms(r) < (job.next_ms or 0) + 1200:  # its next time is now well past
        time.sleep(0.05)
    before = redis_now_ms(r)
    resumed = client.resume(job.id)
    after = redis_now_ms(r)

    assert resumed.status is JobStatus.SCHEDULED
    assert resumed.next_ms is not None and before < resumed.next_ms <= after + 1000
    assert resumed.next_ms == parse_cron("* * * * * *", "UTC").next_after(resumed.next_ms - 1000)
    assert r.zscore(keys.due(job.partition), job.id) == resumed.next_ms
    assert event_types(r, job.partition, job.id) == ["scheduled", "paused", "resumed"]


def test_cancel_is_final_every_later_control_call_is_a_conflict(
    client: Client, r: redis.Redis
) -> None:
    job = client.schedule("tick", cron="0 9 * * *", tz="Europe/Berlin")
    cancelled = client.cancel(job.id)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.next_ms is None
    assert r.zscore(keys.due(job.partition), job.id) is None
    assert client.cancel(job.id).status is JobStatus.CANCELLED  # cancelling twice is harmless

    for call in (client.resume, client.pause, client.trigger):
        with pytest.raises(Conflict) as err:
            call(job.id)
        assert err.value.field == "status"
    assert client.get(job.id).status is JobStatus.CANCELLED
    assert r.zscore(keys.due(job.partition), job.id) is None
    assert event_types(r, job.partition, job.id) == ["scheduled", "cancelled"]


def test_a_job_scheduled_paused_is_not_due_until_resumed(client: Client, r: redis.Redis) -> None:
    job = client.schedule("report", run_at=redis_now_ms(r) - 1000, paused=True)
    assert job.status is JobStatus.PAUSED
    assert due_count(r) == 0
    resumed = client.resume(job.id)
    assert resumed.status is JobStatus.SCHEDULED
    assert r.zscore(keys.due(job.partition), job.id) == job.next_ms


def test_run_fields_finds_an_own_run_in_its_job_hash_and_any_other_run_in_its_own_hash() -> None:
    job = {JB.own_run: b"j@5", JB.type: b"t", JB.queue: b"q", JB.status: b"paused",
           OWN.state.encode(): b"running", OWN.attempt.encode(): b"2", b"h:1-0:1": b"{}"}
    assert run_fields("j@5", {}, job) == {b"state": b"running", b"attempt": b"2", b"type": b"t",
                                          b"queue": b"q"}
    del job[JB.queue]  # not stored at its default (core.layout)
    assert (run_fields("j@5", {}, job) or {}).get(b"queue") == defaults.QUEUE.encode()
    other = {b"state": b"succeeded", b"type": b"t"}
    assert run_fields("j@9", other, job) == other  # a trigger's run: a hash of its own
    assert run_fields("j@9", {}, job) is None


class _Int(int):
    pass


class _S(str):
    pass


@pytest.mark.parametrize("changes", [
    {}, {"type": "bad type"}, {"queue": ""}, {"type": _S("email.send")}, {"max_attempts": True},
    {"max_attempts": 0}, {"priority": 1001}, {"priority": _Int(5)}, {"timeout_ms": 1.5},
    {"backoff_base_ms": -1}, {"backoff_cap_ms": "9"}, {"jitter_ms": 86_400_001},
])
def test_the_fast_usual_check_says_usual_only_for_specs_the_plain_checks_pass(
    changes: dict[str, Any],
) -> None:
    base = JobSpec("email.send", queue="default")
    prepare(base, "3-01JABC", 0, 1 << 20)  # the pair is now seen
    spec = JobSpec(**{**{f: getattr(base, f) for f in JobSpec.__slots__}, **changes})
    ints = (spec.max_attempts, spec.backoff_base_ms, spec.backoff_cap_ms, spec.priority,
            spec.timeout_ms, spec.jitter_ms)
    try:
        check_names(spec.type, spec.queue)
        check_ints(ints)
        plain_passes = True
    except ValidationError:
        plain_passes = False
    usual = usual_fast(spec.type, spec.queue, *ints)
    assert not usual or plain_passes
    assert usual == (not changes)  # the usual spec takes the fast path


@pytest.mark.parametrize(("changes", "shortcut"), [
    ({}, True), ({"run_at": 1_700_000_000_000}, True), ({"paused": True}, True),
    ({"payload": {"to": "a@b.c", "n": [1, 2.5, None]}}, True), ({"payload": b"\x00"}, True),
    ({"run_at": 0}, False), ({"run_at": -5}, False), ({"run_at": True}, False),
    ({"run_at": "2026-01-02T03:04:05Z"}, False), ({"payload": 2**64}, False),
    ({"payload": "x" * (1 << 20)}, False), ({"payload": object()}, False),
    ({"timeout_ms": int("30000")}, False), ({"timeout_ms": 9_000}, False),
    ({"priority": 3}, False), ({"priority": _Int(0)}, False), ({"max_attempts": 5}, False),
    ({"jitter_ms": 5}, False), ({"backoff_base_ms": 7}, False), ({"backoff_cap_ms": 70_000}, False),
    ({"catch_up_window_ms": 0}, False), ({"misfire": "runOnce"}, False),
    ({"misfire": "skip"}, False), ({"overlap": "skip"}, False), ({"tz": "UTC"}, False),
    ({"idempotency_key": "k-1"}, False), ({"cron": "0 9 * * *"}, False),
    ({"start_deadline_ms": 5_000}, False), ({"max_runs": 3}, False),
    ({"type": _S("email.send")}, False), ({"queue": "never.seen"}, False),
    ({"type": "bad type"}, False),
])
def test_prepares_shortcut_for_a_spec_of_defaults_gives_what_the_full_checks_give(
    changes: dict[str, Any], shortcut: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare skips the checks a one-off spec with every setting at its default needs not:
    its Prepared (or error) must be the full checks' own, and only such a spec takes it."""
    now = 1_796_174_891_157
    prepare(JobSpec("email.send", queue="default"), "3-01JABC", now, 1 << 20)  # the pair is seen
    spec = JobSpec(**{"type": "email.send", **changes})

    def outcome(fn: Any, at: int = now) -> Any:
        try:
            return fn(spec, "3-01JABCDEFGHIJKLMNOPQ", at, 1 << 20)
        except ValidationError as e:
            return type(e), str(e)

    checked: list[JobSpec] = []
    with monkeypatch.context() as m:  # first, while a new name is still unseen
        m.setattr(spec_module, "_prepare_checked", lambda s, *a: checked.append(s))
        outcome(prepare)
    assert (not checked) is shortcut
    for at in (now, 0):  # 0: a clock a test injects
        full = outcome(spec_module._prepare_checked, at)
        assert outcome(prepare, at) == full
        assert isinstance(full, tuple) and full[0] is not None


def test_the_async_client_takes_clients_constructor_and_schedule_and_is_exported(
    redis_url: str,
) -> None:
    from rsched import AsyncClient as Exported

    async def main() -> tuple[Job, Job]:
        c = Exported(redis_url)
        try:
            job = await c.schedule("report", {"n": 1}, run_at=int(time.time() * 1000) + 86_400_000)
            return job, await c.get(job.id)
        finally:
            await c.close()

    job, stored = asyncio.run(main())
    assert Exported is AsyncClient and job.type == "report" and stored.payload == {"n": 1}
