"""Per-key limits in the scripts (lua/include/limits.lua), stepped by hand with a real Dispatcher
and Worker (a Rig) on one redis-server: slots taken at claim and freed once per ending, waiting
runs in order, the sliding window, definition changes, families, RateLimited.  The dispatcher's
clock is injected; the worker's scripts use Redis's own, so a claim after a report first moves
the clock to Redis's time (``catch_up``).  The multi-process behaviour is in
tests/processes/test_limits_fleet.py."""

from __future__ import annotations

import asyncio

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from support.cli import ok
from support.helpers import ManualClock, Rig, all_jobs, keys_in_partition, redis_now_ms, xrange
from support.worker import fast_reclaim, gated_app

from rsched import App, Client, Dedup, JobContext, JobSpec, RateLimited, RunState
from rsched.archive.events import decode, expand
from rsched.archive.history import fold
from rsched.core import defaults
from rsched.core.errors import ValidationError
from rsched.core.ids import partition_for_key
from rsched.core.wire import as_text
from rsched.obs import metrics
from rsched.rdb import keys
from rsched.service.status import op_cluster


def limits_app() -> App:
    app = App("limits")

    @app.job("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @app.job("boom")
    async def boom(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    deferred: set[str] = set()

    @app.job("busy")
    async def busy(ctx: JobContext) -> str:
        if ctx.run_id not in deferred:  # the first time: the downstream says 429
            deferred.add(ctx.run_id)
            raise RateLimited(retry_after=5)
        return "ok"

    @app.job("busy-sync")
    def busy_sync(ctx: JobContext) -> str:
        if ctx.run_id not in deferred:
            deferred.add(ctx.run_id)
            raise RateLimited(retry_after=5)
        return "ok"

    @app.job("always-429")
    def always(ctx: JobContext) -> None:
        raise RateLimited(retry_after=0)

    return app


def in_flight(r: redis.Redis, key: str, partitions: int = 16) -> set[str]:
    p = partition_for_key(key, partitions)
    return {as_text(m) for m in r.smembers(keys.limit_running(p, key))}


def waiting(r: redis.Redis, key: str, partitions: int = 16) -> list[str]:
    p = partition_for_key(key, partitions)
    return [as_text(m) for m in r.zrange(keys.limit_waiting(p, key), 0, -1)]


def catch_up(r: redis.Redis, clock: ManualClock) -> None:
    """The dispatcher's clock at least Redis's: runs a report admitted (due at Redis's time)
    are due for the next claim."""
    clock.ms = max(clock.ms, redis_now_ms(r) + 1)


def history_of(r: redis.Redis, run_id: str) -> list[tuple[str, str | None]]:
    """(status, error) of each attempt of the run as the archive folds its events."""
    evs = [decode(p, sid, f) for p in range(16) for eid, entry in xrange(r, keys.events(p))
           for sid, f in expand(eid, entry)]
    return [(a.status, a.error) for a in fold(evs) if a.run_id == run_id]


def limit_metrics(client: Client) -> dict[tuple[str, str], float]:
    """(sample name, limit) -> value of the limit series /metrics shows."""
    text = metrics.render(client.run(op_cluster(client))).decode()
    return {(sample.name, sample.labels["limit"]): sample.value
            for fam in text_string_to_metric_families(text) if fam.name.startswith("rsched_limit")
            for sample in fam.samples}


async def run_all(rig: Rig, n: int) -> None:
    """Fetch the ``n`` runs dispatched (a fetch reads a few per stream) and report them."""
    got = 0
    for _ in range(100):
        got += await rig.fetch()
        if got >= n:
            break
    assert got == n
    reported = 0
    for _ in range(100):
        reported += await rig.finish()
        if reported >= n:
            break
    assert reported == n


def limited(client: Client, key: str, n: int, t0: int, jtype: str = "ok",
            **kw: object) -> list[str]:
    """``n`` one-off jobs of ``key`` due 1 ms apart from ``t0``: their run ids, in order."""
    jobs = all_jobs(client.schedule_many(
        [JobSpec(jtype, run_at=t0 + k, limit_key=key, **kw) for k in range(n)]))  # type: ignore[arg-type]
    return [f"{j.id}@{j.next_ms}" for j in jobs]


def test_a_job_with_a_limit_key_lives_in_its_keys_partition_and_shows_the_key(
    client: Client
) -> None:
    for key in keys_in_partition(5, 3, "tenant-"):
        job = client.schedule("ok", limit_key=key)
        assert job.partition == 5 and job.limit_key == key
        assert client.get(job.id).limit_key == key
        keyed = client.schedule("ok", limit_key=key, idempotency_key="same-" + key)
        assert keyed.partition == 5
    with pytest.raises(ValidationError) as caught:
        client.schedule("ok", limit_key="a*")
    assert caught.value.field == "limitKey"
    # With a dedup window too, the limit key places the job; its window holds there.
    (key,) = keys_in_partition(9, 1, "tenant-")
    first = client.schedule("ok", limit_key=key, dedup=Dedup("dd", 60_000))
    again = client.schedule("ok", limit_key=key, dedup=Dedup("dd", 60_000))
    assert first.partition == 9 and (again.id, again.deduplicated) == (first.id, True)


def test_a_concurrency_limit_parks_runs_over_it_and_each_end_admits_the_earliest(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("acme", concurrency=2)
    t0 = clock() - 100
    runs = limited(client, "acme", 5, t0)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 2
            assert in_flight(r, "acme") == set(runs[:2])
            assert waiting(r, "acme") == runs[2:]
            for rid in runs[2:]:
                run = client.get_run(rid)
                assert (run.state, run.attempt, run.waiting_for) == (
                    RunState.WAITING, 0, "acme")
            view = client.get_limit("acme")
            assert (view.in_flight, view.waiting) == (2, 3)
            assert [(k.key, k.in_flight, k.waiting) for k in view.busiest] == [("acme", 2, 3)]
            shown_cli = ok(redis_url, "limits", "show", "acme").splitlines()
            assert shown_cli[-3:] == ["busiest keys", "KEY   IN FLIGHT  WAITING  RECENT STARTS",
                                      "acme  2          3        0"]
            shown = client.runs(runs[2].partition("@")[0])[0]  # as the job's page shows it
            assert (shown.status, shown.error) == ("waiting", "waiting for limit acme")
            assert limit_metrics(client) == {("rsched_limit_waiting", "acme"): 3,
                                             ("rsched_limit_deferred_total", "acme"): 3,
                                             ("rsched_limit_in_flight", "acme"): 2}
            await run_all(rig, 2)
            # Both slots went to the two earliest waiting runs, due now in the retry set.
            assert in_flight(r, "acme") == set(runs[2:4]) and waiting(r, "acme") == runs[4:]
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 2
            assert client.get_run(runs[4]).state is RunState.WAITING
            await run_all(rig, 2)
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 1
            await run_all(rig, 1)

    asyncio.run(scenario())
    assert in_flight(r, "acme") == set() and waiting(r, "acme") == []
    assert limit_metrics(client) == {("rsched_limit_waiting", "acme"): 0,
                                     ("rsched_limit_deferred_total", "acme"): 3,
                                     ("rsched_limit_in_flight", "acme"): 0}
    # The scrape's walk let go of the idle key: the index holds only busy keys.
    assert not any(r.smembers(keys.limits_running(p)) for p in range(client.settings.partitions))
    for rid in runs:
        run = client.get_run(rid)
        assert (run.state, run.attempt, run.waiting_for) == (RunState.SUCCEEDED, 1, None)


def test_a_failure_frees_the_slot_before_its_retry_which_then_waits_its_turn(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("one", concurrency=1)
    t0 = clock() - 100
    (fails,) = limited(client, "one", 1, t0, "boom", max_attempts=2, backoff_base_ms=0)
    (other,) = limited(client, "one", 1, t0 + 10)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1
            assert in_flight(r, "one") == {fails}
            await run_all(rig, 1)  # fails: retry
            assert in_flight(r, "one") == {other}  # the slot went to the waiting run
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 1  # other; fails' retry waits
            run = client.get_run(fails)
            assert (run.state, run.attempt, run.waiting_for) == (RunState.WAITING, 1, "one")
            await run_all(rig, 1)
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 1
            assert client.get_run(fails).attempt == 2  # the retry, its attempt 2
            await run_all(rig, 1)  # dead-lettered

    asyncio.run(scenario())
    assert client.get_run(fails).state is RunState.DEAD
    assert in_flight(r, "one") == set() and waiting(r, "one") == []


def test_a_cancelled_jobs_waiting_run_is_dropped_and_frees_nothing_it_did_not_hold(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("solo", concurrency=1)
    t0 = clock() - 100
    first, second, third = limited(client, "solo", 3, t0)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1
            client.cancel(second.partition("@")[0])
            await run_all(rig, 1)
            catch_up(r, clock)
            await rig.claim()  # second: abandoned (cancelled), its slot to third
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 1
            assert in_flight(r, "solo") == {third}
            await run_all(rig, 1)

    asyncio.run(scenario())
    assert client.get_run(second).state is RunState.ABANDONED
    assert client.get_run(third).state is RunState.SUCCEEDED
    assert in_flight(r, "solo") == set() and waiting(r, "solo") == []


def test_a_reclaim_keeps_the_slot_for_the_new_attempt_and_the_stale_worker_cannot_free_it(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    app, gates = gated_app()
    client.set_limit("held", concurrency=1)
    t0 = clock() - 100
    run, nxt = limited(client, "held", 2, t0, "long", max_attempts=3)

    async def scenario() -> None:
        async with Rig(redis_url, app, clock=clock, worker_id="w-a",
                       worker_kw=fast_reclaim(100)) as rig:
            b = await rig.add_worker("w-b", **fast_reclaim(100))
            assert (await rig.claim()).dispatched == 1
            assert await rig.fetch() == 1
            await asyncio.sleep(0.3)  # w-a's run looks dead: no heartbeat
            assert await b.reclaim_once() == 1
            assert client.get_run(run).worker == "w-b"
            assert in_flight(r, "held") == {run}  # the slot stays with the run
            gates["w-a"].set()
            await rig.finish()  # w-a's report: fenced
            assert rig.worker.counts["fenced"] >= 1
            assert in_flight(r, "held") == {run} and waiting(r, "held") == [nxt]
            gates["w-b"].set()
            await rig.finish(worker=b)  # the live attempt's report frees it
            assert in_flight(r, "held") == {nxt}

    asyncio.run(scenario())
    assert client.get_run(run).state is RunState.SUCCEEDED


def test_the_sliding_window_never_lets_more_than_the_rate_start_and_keeps_up_with_it(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("api", rate=(3, 10))  # 3 starts in any 10 s
    t0 = clock() - 100
    runs = limited(client, "api", 12, t0)
    starts: list[int] = []

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            for _ in range(80):  # 40 s in half-seconds
                n = (await rig.claim()).dispatched
                starts.extend([clock()] * n)
                clock.advance(500)

    asyncio.run(scenario())
    assert len(starts) == 12  # 12 starts at 3 per 10 s: the last by about 30 s
    assert starts[-1] - starts[0] <= 31_000
    for i, s in enumerate(starts):
        assert sum(1 for t in starts[i:] if t < s + 10_000) <= 3, starts
    at = [client.get_run(rid).dispatched_ms or 0 for rid in runs]
    assert at == sorted(at)  # in the order of their scheduled times


def test_a_definition_change_applies_at_once_raising_lowering_and_deleting(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("chg", concurrency=1)
    t0 = clock() - 100
    runs = limited(client, "chg", 6, t0)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1
            client.set_limit("chg", concurrency=3)  # two more admitted by the write itself
            assert in_flight(r, "chg") == set(runs[:3])
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 2
            client.set_limit("chg", concurrency=1)  # lowered: nothing starts until below 1
            await run_all(rig, 3)
            catch_up(r, clock)
            assert in_flight(r, "chg") == {runs[3]}
            assert (await rig.claim()).dispatched == 1
            client.delete_limit("chg")  # deleted: the rest start
            assert in_flight(r, "chg") == set(runs[3:])
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 2
            await run_all(rig, 3)

    asyncio.run(scenario())
    assert in_flight(r, "chg") == set() and waiting(r, "chg") == []


def test_a_family_limits_each_key_on_its_own_and_the_longest_prefix_wins(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("tenant-*", concurrency=1)
    client.set_limit("tenant-vip-*", concurrency=2)
    t0 = clock() - 100
    a = limited(client, "tenant-a", 3, t0)
    b = limited(client, "tenant-b", 3, t0)
    vip = limited(client, "tenant-vip-x", 3, t0)
    free = limited(client, "other", 3, t0)  # no definition: unlimited

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1 + 1 + 2 + 3

    asyncio.run(scenario())
    assert in_flight(r, "tenant-a") == {a[0]} and in_flight(r, "tenant-b") == {b[0]}
    assert in_flight(r, "tenant-vip-x") == set(vip[:2])
    assert in_flight(r, "other") == set(free)
    assert client.get_run(vip[2]).waiting_for == "tenant-vip-*"
    assert client.get_run(a[1]).waiting_for == "tenant-*"


def test_a_recurring_jobs_occurrence_waits_too_and_runs_as_its_attempt_1(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("cron-key", concurrency=1)
    (blocker,) = limited(client, "cron-key", 1, clock() - 100)
    job = client.schedule("ok", cron="* * * * *", limit_key="cron-key")
    assert job.next_ms is not None
    occurrence = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1  # the blocker
            clock.ms = job.next_ms or 0
            assert (await rig.claim()).dispatched == 0
            assert client.get_run(occurrence).state is RunState.WAITING
            await run_all(rig, 1)
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 1
            await run_all(rig, 1)

    asyncio.run(scenario())
    run = client.get_run(occurrence)
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 1)
    assert in_flight(r, "cron-key") == set()
    assert client.get_run(blocker).state is RunState.SUCCEEDED


@pytest.mark.parametrize("jtype", ["busy", "busy-sync"])
def test_rate_limited_puts_the_run_back_without_spending_an_attempt(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock, jtype: str
) -> None:
    client.set_limit("down", concurrency=1)
    (rid,) = limited(client, "down", 1, clock() - 100, jtype, max_attempts=1)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1
            await run_all(rig, 1)
            run = client.get_run(rid)
            assert (run.state, run.attempt) == (RunState.RETRY_WAIT, 0)
            assert in_flight(r, "down") == set()  # its slot is free meanwhile
            assert history_of(r, rid) == [("deferred", "rate limited: retry after 5 s")]
            p = partition_for_key("down", 16)
            due = r.zscore(keys.retry(p), rid)
            assert due is not None and due - redis_now_ms(r) > 4_000
            catch_up(r, clock)
            assert (await rig.claim()).dispatched == 0  # not before retry_after
            clock.ms = int(due)
            assert (await rig.claim()).dispatched == 1
            await run_all(rig, 1)

    asyncio.run(scenario())
    run = client.get_run(rid)
    # max_attempts 1, yet it ran a second time: the deferral spent no attempt.
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 1)
    assert history_of(r, rid) == [("succeeded", None)]


def test_a_start_deadline_expiry_and_a_handler_wait_dead_letter_free_their_slots(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("late", concurrency=1)
    client.set_limit("orphan", concurrency=1)
    now = redis_now_ms(r)
    clock.ms = now + 10  # every one due
    (late,) = limited(client, "late", 1, now - 1000, start_deadline_ms=1500)
    (after_late,) = limited(client, "late", 1, now)
    (orphan,) = limited(client, "orphan", 1, now, "nobody-home")
    (after_orphan,) = limited(client, "orphan", 1, now + 1)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock, worker_kw={
                "handler_wait_s": 1.0, "visibility_ms": 1500, "heartbeat_ms": 500}) as rig:
            assert (await rig.claim()).dispatched == 2  # late and orphan; the others wait
            await asyncio.sleep(0.8)  # late is past runAt + 1.5 s when its worker asks
            for _ in range(20):
                await rig.fetch()
                await rig.worker.handback.settle()
                if client.get_run(late).state is RunState.DEAD:
                    break
            assert in_flight(r, "late") == {after_late}  # expire.lua freed it
            await asyncio.sleep(1.8)  # the handler wait, and the set-aside entry idle again
            for _ in range(40):
                await rig.worker.reclaim_once()
                if client.get_run(orphan).state is RunState.DEAD:
                    break
                await asyncio.sleep(0.1)
            assert in_flight(r, "orphan") == {after_orphan}  # park.lua freed it

    asyncio.run(scenario())
    assert client.get_run(late).error == "missed start deadline"
    assert (client.get_run(orphan).error or "").startswith("no live worker serves type")


def test_a_handler_that_always_raises_rate_limited_ends_in_the_dead_letters(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    """Each RateLimited spends no attempt, up to defaults.MAX_DEFERRALS a run; the next one is
    a failed attempt, so maxAttempts (here 1) ends the run."""
    job = client.schedule("always-429", run_at=clock() - 100, max_attempts=1)
    rid = f"{job.id}@{job.next_ms}"

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            for n in range(defaults.MAX_DEFERRALS + 1):
                if n:  # the first went straight to its queue (schedule.lua)
                    catch_up(r, clock)
                    assert (await rig.claim()).dispatched == 1, n
                await run_all(rig, 1)
                if n < defaults.MAX_DEFERRALS:
                    assert client.get_run(rid).state is RunState.RETRY_WAIT, n

    asyncio.run(scenario())
    run = client.get_run(rid)
    assert (run.state, run.attempt) == (RunState.DEAD, 1)
    assert f"deferred {defaults.MAX_DEFERRALS} times" in (run.error or "")


def test_a_cancelled_head_of_a_rate_limited_key_passes_its_turn_on(
    redis_url: str, client: Client, r: redis.Redis, clock: ManualClock
) -> None:
    client.set_limit("slowapi", rate=(1, 10))  # 1 start in any 10 s
    t0 = clock() - 100
    a, b, c = limited(client, "slowapi", 3, t0)

    async def scenario() -> None:
        async with Rig(redis_url, limits_app(), clock=clock) as rig:
            assert (await rig.claim()).dispatched == 1  # a; b (the head) and c wait
            assert waiting(r, "slowapi") == [b, c]
            client.cancel(b.partition("@")[0])
            clock.advance(10_000)  # the window lets b start: it is abandoned instead
            assert (await rig.claim()).dispatched == 0
            assert (await rig.claim()).dispatched == 1  # c's turn, made due by b leaving

    asyncio.run(scenario())
    assert client.get_run(b).state is RunState.ABANDONED
    assert client.get_run(c).state is RunState.DISPATCHED
    assert waiting(r, "slowapi") == []
