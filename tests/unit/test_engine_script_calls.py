"""The script calls rdb builds for the engine (rdb.claim_script, rdb.leases, rdb.run_scripts)
held against each script's header, their replies parsed into core.codes values, the worker's
raw stream reads, and the read-along hand-off between a report and the fetch loop.  No Redis."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from support.headers import check_args, check_keys, keys_after, match

from rsched.core.codes import ExpireCode, HeartbeatCode, LeaseCode, ParkCode
from rsched.core.ids import random_job_ids
from rsched.core.models import partition_of
from rsched.core.settings import Settings
from rsched.core.wire import CLAIM_RETRY, ENTRY_OWN, ENTRY_TYPE, ClaimItem
from rsched.engine.worker.inflight import Inflight, Outcome, inflight
from rsched.engine.worker.read_along import ReadAlong
from rsched.rdb import claim_script, keys, leases, run_scripts, worker_registry, worker_streams
from rsched.rdb.claim_script import ClaimReply
from rsched.rdb.leases import LeaseReply

NOW = 1_700_000_000_000
JOBS = random_job_ids(3, 5, NOW)
P = partition_of(JOBS[0])
S = Settings(events_maxlen=77, history_len=9, run_ttl_ms=1000, finished_ttl_ms=2000)
STREAM = keys.stream(P, "mail")


def held(job_id: str, *, own: bool, fence: int = 0, t0: float = 10.0) -> Inflight:
    """A run as the worker's intake makes it from a stream entry."""
    f = {ENTRY_TYPE: b"send"} | ({ENTRY_OWN: b"1"} if own else {})
    fl = inflight(partition_of(job_id), STREAM, "mail", "5-0", f"{job_id}@{NOW}", f, 1, t0)
    fl.fence = fence
    return fl


# --- the dispatcher -------------------------------------------------------------------------------


def test_a_claim_call_holds_keys_and_arguments_where_claims_header_lists_them() -> None:
    item = ClaimItem(CLAIM_RETRY, JOBS[1], f"{JOBS[1]}@{NOW}", NOW, 0, 0, 0, 1)
    once = [JOBS[0].encode(), JOBS[2].encode()]
    name, ks, args = claim_script.call(P, "d1", 7, 0, 77, 1000, 9, ["a", "b"], [item], once)
    assert name == "claim"
    fixed = check_keys(name, list(ks), P)
    assert list(ks[len(fixed):]) == [
        keys.stream(P, "a"), keys.stream(P, "b"),
        keys.job(P, JOBS[0]).encode(), keys.job(P, JOBS[2]).encode(),
        keys.job(P, JOBS[1]), keys.run(P, item.run_id), keys.history(P, JOBS[1]), keys.dead(P)]
    listed = check_args(name, list(args), {
        "owner": "d1", "fence": 7, "now_ms": 0, "events_maxlen": 77, "nq": 2, "n items": 1,
        "consumer group": keys.GROUP, "no": 2, "run_ttl_ms": 1000,
        "history_len": 9})
    assert list(args[len(listed):]) == [*once, *item]
    # The active runs of overlap items: after the items' arguments, their keys before dead.
    active = f"{JOBS[1]}@{NOW - 60_000}"
    _, ks2, args2 = claim_script.call(P, "d1", 7, 0, 77, 1000, 9, ["a", "b"], [item], once,
                                      [active])
    assert list(ks2) == [*ks[:-1], keys.run(P, active), keys.dead(P)]
    assert list(args2) == [*args, active]


def test_a_claim_reply_reads_as_counts_the_earliest_left_and_the_ids_handed_back() -> None:
    assert ClaimReply.of([-1]).stale
    reply = ClaimReply.of([3, 1, b"1700000000000.5", b"j1", b"r@1"])
    assert not reply.stale
    assert reply == (3, 1, 1_700_000_000_000.5, frozenset({"j1", "r@1"}))
    assert ClaimReply.of([0, 0, b""]) == (0, 0, float("inf"), frozenset())


def test_a_lease_call_holds_keys_and_arguments_where_leases_header_lists_them() -> None:
    name, ks, args = leases.call(P, "d1", 30_000, 0, leases.RENEW, 7, "d2")
    assert len(ks) == len(check_keys(name, list(ks), P))
    assert len(args) == len(check_args(name, list(args), {
        "owner id": "d1", "lease_ms": 30_000, "now_ms": 0, "mode": "renew",
        "fence the caller holds": 7, "offer_to": "d2"}))
    assert LeaseReply.of([1, 8, NOW, b"d1"]) == (LeaseCode.HELD, 8)
    assert LeaseReply.of([-1, 0]).code is LeaseCode.STALE


# --- the worker -----------------------------------------------------------------------------------


def test_a_complete_call_groups_runs_by_stream_and_kind_as_completes_header_lays_them_out() -> None:
    own, other, failed = (held(JOBS[0], own=True), held(JOBS[1], own=False, fence=4),
                          held(JOBS[2], own=False))
    batch = [Outcome(own, "succeeded", 3, "null", 0), Outcome(other, "succeeded", 4, "1", 0),
             Outcome(failed, "failed", 5, "boom", 250)]
    calls, parts = run_scripts.complete("w1", S, batch, 10.5)
    by_p: dict[int, list[Outcome]] = {}
    for o in batch:
        by_p.setdefault(o.fl.partition, []).append(o)
    assert dict(parts) == by_p and [c[0] for c in calls] == ["complete"] * len(by_p)
    for (name, ks, args), (p, outcomes) in zip(calls, parts, strict=True):
        fixed = check_keys(name, list(ks), p)
        groups: dict[tuple[str, bool], list[Outcome]] = {}
        for o in outcomes:
            groups.setdefault((o.fl.stream, o.fl.run_key == o.fl.job_key), []).append(o)
        listed = check_args(name, list(args), {
            "worker id": "w1", "now_ms": 0, "events_maxlen": 77, "group": keys.GROUP,
            "g groups of runs": len(groups), "history length": 9, "run_ttl_ms": 1000,
            "finished_ttl_ms": 2000})
        assert list(ks[len(fixed):len(fixed) + len(groups)]) == [s for s, _ in groups]
        want_keys: list[str] = []
        want_args: list[Any] = []
        for (_, is_own), items in groups.items():
            ok = all(o.status == "succeeded" for o in items)
            want_args += [len(items), ("1" if is_own else "0") + ("s" if ok else "")]
        for (_, is_own), items in groups.items():
            ok = all(o.status == "succeeded" for o in items)
            for o in items:
                fl = o.fl
                want_keys += ([fl.job_key] if is_own else
                              [fl.run_key, fl.job_key, keys.history(p, fl.job_id)])
                want_args += [fl.run_id, fl.fence, o.duration_ms, o.text, fl.entry_id, 500]
                want_args += [] if ok else [o.status, o.delay_ms]
        assert list(ks[len(fixed) + len(groups):]) == want_keys
        assert list(args[len(listed):]) == want_args


def test_runs_of_a_queue_with_a_retention_of_its_own_go_in_a_call_with_its_ttls() -> None:
    """RSCHED_QUEUE_RETENTION_MS: complete.lua's run_ttl_ms and finished_ttl_ms are per call, so
    a partition's runs of such a queue go in a call of their own."""
    kept = replace(S, queue_retention_ms=(("mail", 5_000),))
    mail = held(JOBS[0], own=True)
    other = held(JOBS[0], own=True)
    other.stream = keys.stream(other.partition, "default")
    batch = [Outcome(mail, "succeeded", 3, "null", 0), Outcome(other, "succeeded", 4, "null", 0)]
    calls, parts = run_scripts.complete("w1", kept, batch, 10.5)
    assert [items for _, items in parts] == [[batch[0]], [batch[1]]]
    assert [list(c[2][6:8]) for c in calls] == [[5_000, 5_000], [1000, 2000]]
    assert run_scripts.complete("w1", S, batch, 10.5)[1] == [(mail.partition, batch)]


def test_a_start_call_has_four_keys_and_four_values_a_run_in_starts_header_order() -> None:
    fls = [held(JOBS[0], own=True), held(JOBS[0], own=False)]
    [(name, ks, args)] = run_scripts.start("w1", S, {P: fls}, run_scripts.RECLAIMED, 12.0)
    fixed = check_keys(name, list(ks), P)
    per_run = keys_after(name, "then per run 4 keys:")
    assert match(per_run, list(ks[len(fixed) + 4:]), P)  # the second run: not its job's own
    assert ks[len(fixed)] == fls[0].job_key  # an own run's fields live in its job hash
    listed = check_args(name, list(args), {
        "worker id": "w1", "now_ms": 0, "events_maxlen": 77, "group": keys.GROUP, "n runs": 2,
        "history length": 9, "parked consumers' prefix": keys.PARKED_CONSUMER})
    assert list(args[len(listed):]) == [v for fl in fls for v in (fl.run_id, "5-0", 2000, 1)]
    assert run_scripts.started([5, 1, 0, 2, -1, 1]) == [(5, 1), (0, 2), (-1, 1)]


def test_a_heartbeat_call_and_its_codes() -> None:
    fl = held(JOBS[0], own=False, fence=6)
    [(name, ks, args)] = run_scripts.heartbeat("w1", 77, {P: [(fl, '{"value":5}')]})
    fixed = check_keys(name, list(ks), P)
    assert match(keys_after(name, "then per run 3 keys:"), list(ks[len(fixed):]), P)
    listed = check_args(name, list(args), {"worker id": "w1", "now_ms": 0, "group": keys.GROUP,
                                           "n": 1, "events_maxlen": 77})
    assert list(args[len(listed):]) == [fl.run_id, 6, "5-0", '{"value":5}']
    assert run_scripts.heartbeat_codes([1, b"2", -1, 0]) == [
        HeartbeatCode.OURS, HeartbeatCode.STOP, HeartbeatCode.FENCED, HeartbeatCode.GONE]


def test_a_park_call_and_its_codes() -> None:
    fl = held(JOBS[0], own=False)
    [(name, ks, args)] = run_scripts.park("w1", 77, 60_000, 30_000, {P: [(fl, -1)]})
    fixed = check_keys(name, list(ks), P)
    assert match(keys_after(name, "then per entry 3 keys:"), list(ks[len(fixed):]), P)
    listed = check_args(name, list(args), {
        "worker id": "w1", "now_ms": 0, "events_maxlen": 77, "group": keys.GROUP,
        "n entries": 1, "handler wait": 60_000, "visibility timeout": 30_000,
        "parked consumers' prefix": keys.PARKED_CONSUMER})
    assert list(args[len(listed):]) == [fl.run_id, "5-0", "send", -1]
    assert run_scripts.park_codes([1, 2, 0]) == [ParkCode.PARKED, ParkCode.DEAD_LETTERED,
                                                 ParkCode.NOT_OURS]


def test_an_expire_call_and_its_reply() -> None:
    fl = held(JOBS[0], own=False)
    name, ks, args = run_scripts.expire(fl, 77)
    assert len(ks) == len(check_keys(name, list(ks), P))
    assert len(args) == len(check_args(name, list(args), {
        "run id": fl.run_id, "stream entry id": "5-0", "now_ms": 0, "events_maxlen": 77,
        "consumer group": keys.GROUP}))
    assert run_scripts.expired(1) is ExpireCode.DEAD_LETTERED
    assert run_scripts.expired(b"0") is ExpireCode.RUN


def test_a_read_and_its_probe_are_two_xreadgroups_of_the_consumers_new_entries() -> None:
    assert worker_streams.read_commands("w1", ["s1", "s2"], 8, 500, ("s3",)) == [
        ("XREADGROUP", "GROUP", keys.GROUP, "w1", "COUNT", 8, "BLOCK", 500,
         "STREAMS", "s1", "s2", ">", ">"),
        ("XREADGROUP", "GROUP", keys.GROUP, "w1", "COUNT", 1, "STREAMS", "s3", ">")]
    assert worker_streams.read_commands("w1", ["s1"], 2) == [
        ("XREADGROUP", "GROUP", keys.GROUP, "w1", "COUNT", 2, "STREAMS", "s1", ">")]


def test_a_parked_count_names_its_queue_and_type_and_a_foreign_name_names_none() -> None:
    name = worker_registry.parked_name("mail", "send")
    assert worker_registry.parked_of(name) == ("mail", "send")
    assert worker_registry.parked_of("not json") is None
    assert worker_registry.parked_of('["one"]') is None


# --- the read-along hand-off ----------------------------------------------------------------------


class CountingReader:
    """A reader that plans a read of ``free`` entries while slots would be free."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.took: list[tuple[Any, Any]] = []

    def plan_with_report(self, freed: int) -> Any:
        return ("plan", self.free + freed) if self.free + freed > 0 else None

    def read_commands(self, plan: Any) -> list[tuple[Any, ...]]:
        return [("XREADGROUP", plan[1])]

    def took_with_report(self, plan: Any, replies: list[Any] | None) -> int:
        self.took.append((plan, replies))
        return 0 if replies is None else len(replies)


def test_a_report_reads_along_only_while_the_fetch_loop_waits_and_one_read_at_a_time() -> None:
    along, reader, stop = ReadAlong(), CountingReader(0), asyncio.Event()
    assert not along.is_open and along.plan(4) is None
    along.open(reader)
    assert along.is_open and along.plan(4) is None  # the fetch loop is not waiting
    with along.waiting(stop):
        assert along.plan(0) is None  # no slot free even then
        assert along.plan(4) == [("XREADGROUP", 4)]
        assert along.plan(4) is None  # one read at a time
        assert along.took([b"r1", b"r2"]) == 2
        assert along.plan(2) == [("XREADGROUP", 2)]
        along.close()  # the fetch loops ended: the read under way still lands with its reader
        assert along.took(None) == 0
        along.open(reader)
        stop.set()
        assert along.plan(4) is None  # draining: no new runs
    assert along.plan(4) is None
    assert reader.took == [(("plan", 4), [b"r1", b"r2"]), (("plan", 2), None)]
    assert along.took(None) == 0  # nothing planned: nothing to take
