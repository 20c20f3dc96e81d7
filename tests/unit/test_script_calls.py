"""The script calls rdb builds for the service (rdb.job_scripts, rdb.schedule_script), held
against each script's header: every KEYS[i] it lists matches the key built there, every ARGV[i]
carries the value its label names, and the replies parse into core.codes values.  No Redis."""

from __future__ import annotations

from typing import Any

import pytest
from support.headers import check_args, check_keys, keys_after, match

from rsched.core.codes import (
    BackfillCode,
    BackfillRun,
    ControlCode,
    DeleteDeadCode,
    ScheduleCode,
)
from rsched.core.ids import partition_for_key, random_job_ids
from rsched.core.layout import J
from rsched.core.models import BackfillOverlap, Overlap, partition_of
from rsched.core.spec import OWN_FIELDS, SHARED_FIELDS, Dedup, JobSpec, prepare
from rsched.rdb import job_scripts, keys, schedule_script
from rsched.rdb.job_scripts import BackfillReply, ControlReply
from rsched.rdb.schedule_script import DedupArgs, ScheduleReply
from rsched.rdb.scripts import Call

NOW = 1_700_000_000_000
JOB = random_job_ids(1, 5, NOW)[0]
P = partition_of(JOB)
RUN = f"{JOB}@{NOW - 60_000}"


CONTROL_CASES: list[tuple[Call, dict[str, Any]]] = [
    (job_scripts.pause(JOB, 77, 5, "ann", "a note"),
     {"job id": JOB, "now_ms": 0, "events_maxlen": 77, "expected version": 5,
      "who pauses": "ann", "their note": "a note"}),
    (job_scripts.cancel(JOB, 77, None, 5_000),
     {"job id": JOB, "now_ms": 0, "events_maxlen": 77, "expected version": "",
      "finished_ttl_ms": 5_000}),
    (job_scripts.resume(JOB, 77, NOW, NOW + 0.5, 3, "bob", ""),
     {"job id": JOB, "now_ms": 0, "events_maxlen": 77, "next_ms": NOW, "next_score": NOW + 0.5,
      "expected version": 3, "who resumes": "bob", "their note": ""}),
    (job_scripts.update(JOB, 77, "scheduled", NOW, "", "", None, [J.spec, b"x"]),
     {"job id": JOB, "now_ms": 0, "events_maxlen": 77, "expected status": "scheduled",
      "expected next_ms": NOW, "new next_ms": "", "new due score": "",
      "expected version": "", "nfields": 1}),
    (job_scripts.trigger(JOB, RUN, NOW, 77),
     {"job id": JOB, "run id": RUN, "sched_ms": NOW, "now_ms": 0, "events_maxlen": 77}),
    (job_scripts.replay(RUN, 77, Overlap.BUFFER_ONE),
     {"run id": RUN, "now_ms": 0, "events_maxlen": 77, "overlap": "b"}),
]


@pytest.mark.parametrize(("call", "expected"), CONTROL_CASES, ids=[c[0] for c, _ in CONTROL_CASES])
def test_a_control_call_holds_its_keys_and_arguments_where_its_header_lists_them(
        call: Call, expected: dict[str, Any]) -> None:
    name, ks, args = call
    listed_keys = check_keys(name, list(ks), P)
    assert len(ks) == len(listed_keys)
    listed_args = check_args(name, list(args), expected)
    pairs = list(args[len(listed_args):])
    assert pairs == ([J.spec, b"x"] if name == "update" else [])


def test_a_control_reply_reads_as_its_code_and_status() -> None:
    assert ControlReply.of([-2, b"cancelled"]) == (ControlCode.REFUSED, "cancelled")
    assert ControlReply.of([1, b"paused"]).code is ControlCode.DONE


def test_a_backfill_call_lists_a_run_key_per_occurrence_after_its_header_keys() -> None:
    times = [NOW - 120_000, NOW - 60_000]
    name, ks, args = job_scripts.backfill(JOB, 77, 3_600_000, 9, BackfillOverlap.SKIP, times,
                                          "=")
    fixed = check_keys(name, list(ks), P)
    assert list(ks[len(fixed):]) == [keys.run(P, f"{JOB}@{t}") for t in times]
    listed = check_args(name, list(args), {
        "job id": JOB, "now_ms": 0, "events_maxlen": 77, "run_ttl_ms": 3_600_000,
        "overlap": "s", "dry": "=", "history_len": 9, "tail": "", "n": 2})
    assert list(args[len(listed):]) == times
    # bufferAll, behind the job's last bufferAll run: its key in place of the unused one.
    tail = f"{JOB}@{NOW - 180_000}"
    _, ks2, args2 = job_scripts.backfill(JOB, 77, 0, 9, BackfillOverlap.BUFFER_ALL, times, "",
                                         tail)
    assert ks2[4] == keys.run(P, tail) and ks2[:4] == ks[:4] and ks2[5:] == ks[5:]
    assert (args2[4], args2[7]) == ("a", tail)


def test_a_backfill_reply_reads_as_codes_per_occurrence_and_a_dry_runs_state() -> None:
    reply = BackfillReply.of([1, b"", 1, 0, 3, b"r1", b""], 3)
    assert reply == (BackfillCode.DONE, "", [BackfillRun.QUEUED, BackfillRun.EXISTS,
                                             BackfillRun.BUFFERED], "r1", "")
    assert BackfillReply.of([-2, b"cancelled"], 0)[:2] == (BackfillCode.REFUSED, "cancelled")


def test_a_delete_dead_call_has_three_keys_and_one_value_per_run_in_its_headers_order() -> None:
    per_run = keys_after("delete_dead", "then per run 3 keys:")
    other = f"{JOB}@{NOW}"
    name, ks, args = job_scripts.delete_dead(P, [RUN, other], 77, "cli", 50, "OP1", 9_000)
    fixed = check_keys(name, list(ks), P)
    for k, rid in enumerate([RUN, other]):
        got = ks[len(fixed) + 3 * k : len(fixed) + 3 * k + 3]
        assert match(per_run, list(got), P)
        assert got[0] == keys.run(P, rid)
    listed_args = check_args(name, list(args), {
        "now_ms": 0, "events_maxlen": 77, "who": "cli", "history length": 50,
        "operation id": "OP1", "keep_ms": 9_000, "n runs": 2})
    assert list(args[len(listed_args):]) == [RUN, other]
    assert job_scripts.deleted([1, 0]) == [DeleteDeadCode.DELETED, DeleteDeadCode.NOT_DEAD]


def test_a_schedule_call_holds_its_header_keys_arguments_field_names_and_groups() -> None:
    """Two groups: a one-off due now (straight to its queue stream, named by its KEYS index)
    and a paused one (not indexed)."""
    p = 3
    ids = random_job_ids(3, p, NOW)
    specs = [JobSpec("a", None, queue="q1"), JobSpec("a", None, queue="q1"),
             JobSpec("b", None, paused=True)]
    preps = [prepare(s, i, NOW, 1 << 20) for s, i in zip(specs, ids, strict=True)]
    (name, ks, args), order, sizes = schedule_script.call(p, preps, NOW, 77)
    assert name == "schedule"
    fixed = check_keys(name, list(ks), p)
    assert list(ks[len(fixed):len(fixed) + 3]) == [keys.job(p, ids[k]) for k in order or [0, 1, 2]]
    assert list(ks[len(fixed) + 3:]) == [keys.stream(p, "q1")]
    listed = check_args(name, list(args), {
        "now_ms": 0, "events_maxlen": 77, "consumer group": keys.GROUP, "due_ms": NOW, "n": 3,
        "ns": len(SHARED_FIELDS), "no": len(OWN_FIELDS), "keyed": 0, "dedup": 0})
    at = len(listed)
    assert list(args[at:at + len(SHARED_FIELDS) + len(OWN_FIELDS)]) == [*SHARED_FIELDS,
                                                                         *OWN_FIELDS]
    at += len(SHARED_FIELDS) + len(OWN_FIELDS)
    count, stream, scored = args[at:at + 3]  # the first group: the two jobs due now on q1
    assert (count, scored) == (2, 1)
    assert ks[stream - 1] == keys.stream(p, "q1")
    assert sorted(sizes) == [(("a", "q1"), 2), (("b", preps[2].shared()[1]), 1)]


def test_a_schedule_reply_reads_as_wake_stamp_a_code_per_job_and_the_jobs_codes_are_about(
) -> None:
    assert ScheduleReply.of([1, NOW, 0, 1, 2], 3) == (True, NOW, [0, 1, 2], [])
    assert ScheduleReply.of([0, b"12", 0], 1).wake is False
    assert ScheduleReply.of([0, NOW, 3, 0, 4, b"5-a", b"5-b"], 3) == (
        False, NOW, [ScheduleCode.DEDUPLICATED, 0, ScheduleCode.HELD_ELSEWHERE], ["5-a", "5-b"])


def test_a_dedup_call_names_each_window_s_record_and_guess_by_their_keys_index() -> None:
    """Two jobs of one key (one record key, sent once), one with a guess: each job's window
    comes before its id, and the record and guessed job keys follow the streams."""
    d = Dedup("k", 5000, "untilDone")
    p = partition_for_key("k", 16)
    ids = random_job_ids(2, p, NOW)
    preps = [prepare(JobSpec("a", None, dedup=d), i, NOW, 1 << 20) for i in ids]
    (name, ks, args), _, _ = schedule_script.call(
        p, preps, NOW, 77, [DedupArgs(d, ""), DedupArgs(d, "5-held")])
    check_args(name, list(args), {"keyed": 0, "dedup": 1})
    record, held = keys.dedup(p, "k"), keys.job(p, "5-held")
    assert list(ks[-2:]) == [record, held] and ks.count(record) == 1
    first = args.index(ids[0])
    assert list(args[first - 5:first]) == [len(ks) - 1, "untilDone", 5000, 0, ""]
    second = args.index(ids[1])
    assert list(args[second - 5:second]) == [len(ks) - 1, "untilDone", 5000, len(ks), "5-held"]
