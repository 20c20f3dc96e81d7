"""The analyzer: what was acknowledged, what ran (the sink), what Redis says; one JSON report.

Definitions (docs/internals/fault-checker.md says the same):

* lost: an acknowledged one-off job that never ran to success and is not dead-lettered.  Lost
  inside the AOF window: a lost job that Redis no longer knows, acknowledged after the
  simulated last fsync of a machine loss and before Redis was started again (`in_window`).
  On a cluster or Sentinel (`vanished_is_lost`) an acknowledged job that Redis no longer knows
  is lost even when it ran (a failover rolled back a write it had acknowledged), and no window
  excuses it: every acknowledged write waited for a replica.
* duplicate: an execution of a run after an earlier one that did not fail (a failed attempt is
  followed by its retry, by design).  Explained when a fault (chaos.faults) disturbed the earlier
  execution's process, or Redis, between its start and its end (or the later start) + 1.5 s,
  and began before the later execution started; or when a fault disturbed the later
  execution's process between the earlier start - visibility timeout and the later start (it
  held a delivery of the run through the fault, and ran it when it woke: a worker runs a fresh
  entry before recording its start).
* stale writes accepted: chaos.history, plus `final_state_without_execution`: the run's recorded
  outcome names a worker and attempt that the sink shows no matching execution for, or one
  that an execution with a newer attempt had started before it ended (machine losses excepted:
  they reissue attempt numbers).
* limits (a run with --limit-keys): no key's runs execute more than its limit at once, by the
  sink's times (an execution a kill cut short ends at the kill; one of a duplicate pair, or an
  older attempt begun after a newer one of its run had started, that a stall, freeze, dropped
  connection or Redis fault disturbed while it ran or within the visibility timeout before it
  began is left out, explained), and no slot is left held once everything has ended.
* cron: occurrences from each job's first until 3 s before it was paused; a missing one is
  explained only by its job's catch-up window: the next occurrence that ran was dispatched more
  than the window after it (half the jobs keep the default 60 s window, so a fault must delay
  nothing of theirs past it; the others have 1 s, shorter than a dispatcher outage).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rsched import Client, NotFound
from rsched.core.cron import parse_cron
from rsched.core.models import partition_of

from .faults import FAILOVER_OPS, INF, Faults
from .history import History, stale_writes
from .load import Ack
from .sink import Execution

EXAMPLES = 5
SLACK_MS = 1500
# The recovery bound (docs/guarantees.md, "Recovery"): how late a job may start after it was due.
HEALTHY_LATE_MS = 2000  # no fault touched it
FAULT_LATE_MS = 5000  # one fault of a worker or dispatcher did


# appendfsync everysec: while a background fsync runs, Redis postpones write()ing its AOF buffer
# for up to 2 s of its second-granularity clock and still replies, so a kill -9 alone can undo
# what it acknowledged in the last < 3 s (docs/internals/fault-checker.md, "The AOF window").
KILL_UNWRITTEN_MS = 3000


def in_window(fault: dict[str, Any], ack_ms: int) -> bool:
    """Whether a write acknowledged at ``ack_ms`` may be undone by this Redis fault: for a
    machine loss, read after its simulated last fsync; for a plain kill, in the
    KILL_UNWRITTEN_MS before it; either way before Redis was started again.  The kill's ``t0``
    is read before the signal lands, and the dying server still answers in between (a batch
    acknowledged 1 ms after t0 was once reported lost); until the restart, no other server
    can have sent a reply.  Logs without ``respawn_ms`` end the window at ``t0``."""
    if fault["op"] == "redis_lose":
        lo = fault["fsynced_ms"]
    elif fault["op"] == "redis_kill":
        lo = fault["t0"] - KILL_UNWRITTEN_MS
    else:
        return False
    return bool(lo <= ack_ms <= fault.get("respawn_ms", fault["t0"]))


def _pct(values: list[int]) -> dict[str, int]:
    if not values:
        return {}
    v = sorted(values)
    return {"p50": v[len(v) // 2], "p99": v[len(v) * 99 // 100], "max": v[-1]}


def _sched(run_id: str) -> int:
    return int(run_id.rsplit("@", 1)[1])


class Analyzer:
    def __init__(self, *, acks: list[Ack], executions: dict[str, list[Execution]],
                 history: History, faults: Faults, client: Client, crons: list[dict[str, Any]],
                 visibility_ms: int, heartbeat_ms: int, agreement_sample: int | None,
                 vanished_is_lost: bool = False) -> None:
        self.acks = acks
        self.x = executions
        self.h = history
        self.faults = faults
        self.client = client
        self.crons = crons
        self.visibility_ms = visibility_ms
        self.heartbeat_ms = heartbeat_ms
        self.sample = agreement_sample
        self.vanished_is_lost = vanished_is_lost

    def ok_run(self, rid: str) -> bool:
        return any(x.ok for x in self.x.get(rid, ()))

    # --- lost ----------------------------------------------------------------------------

    def lost(self) -> dict[str, Any]:
        missing = [a for a in self.acks if self.vanished_is_lost or not self.ok_run(a.run_id)]
        runs = self.client.run(self.client.op_read_runs([a.run_id for a in missing]))
        lost, windowed, dead = [], [], 0
        for a, run in zip(missing, runs, strict=True):
            if run is not None and run.state.value == "dead":
                dead += 1
                continue
            if run is not None and self.ok_run(a.run_id):
                continue  # ran, and Redis still has it (vanished_is_lost reads every ack)
            loss = next((f for f in self.faults.log if in_window(f, a.ack_ms)), None)
            row = {"job": a.job_id, "type": a.type, "ack_ms": a.ack_ms,
                   "in_redis": run is not None, "state": run.state.value if run else None,
                   "ran": self.ok_run(a.run_id)}
            if loss is not None and run is None:
                windowed.append({**row, "fault": loss["op"],
                                 "before_kill_ms": loss["t0"] - a.ack_ms})
            else:
                row["last_fault_before"] = next(
                    (f.label() for f in reversed(self.faults.all) if f.lo_ms <= a.ack_ms), None)
                lost.append(row)
        return {"lost": {"count": len(lost), "examples": lost[:EXAMPLES]},
                "lost_in_aof_window": {
                    "count": len(windowed),
                    "max_before_kill_ms": max((r["before_kill_ms"] for r in windowed
                                               if r["fault"] == "redis_lose"), default=None),
                    "after_plain_kill": {
                        "count": sum(r["fault"] == "redis_kill" for r in windowed),
                        "max_before_kill_ms": max((r["before_kill_ms"] for r in windowed
                                                   if r["fault"] == "redis_kill"),
                                                  default=None)},
                    "examples": windowed[:EXAMPLES]},
                "dead_lettered": dead}

    def acked_while_lagging(self) -> dict[str, Any]:
        """Jobs acknowledged on a master's partitions after its replica was cut off and before
        the master was killed: what WAIT must refuse (sent 50 ms after the cut: earlier ones
        may have reached the replica first)."""
        lagging = [f for f in self.faults.log if f["op"] in FAILOVER_OPS]
        found = [a for a in self.acks for f in lagging
                 if partition_of(a.job_id) in f["partitions"]
                 and f["lagged_ms"] + 50 <= a.sent_ms and a.ack_ms <= f["t0"]]
        return {"count": len(found), "examples": [a.job_id for a in found[:EXAMPLES]]}

    # --- duplicates ----------------------------------------------------------------------

    def duplicates(self) -> dict[str, Any]:
        explained: Counter[str] = Counter()
        unexplained = []
        runs = 0
        for rid, xs in self.x.items():
            dups = 0
            for prev, nxt in zip(xs, xs[1:], strict=False):
                if prev.ok is False:
                    continue  # a failed attempt, then its retry
                dups += 1
                hi = (prev.ended_ms or nxt.started_ms) + SLACK_MS
                f = self.faults.hit(prev.worker, prev.started_ms - SLACK_MS, hi, nxt.started_ms)
                if f is None:  # the later one ran a delivery its process held through a fault
                    lo = prev.started_ms - self.visibility_ms - SLACK_MS
                    f = self.faults.hit(nxt.worker, lo, nxt.started_ms, nxt.started_ms)
                if f is not None:
                    explained[f.op] += 1
                else:
                    unexplained.append({"run": rid, "earlier": _row(prev), "later": _row(nxt),
                                        "events": self.h.runs.get(rid, [])})
            runs += dups > 0
        return {"count": sum(explained.values()) + len(unexplained), "runs": runs,
                "explained": sum(explained.values()), "explained_by": dict(explained),
                "unexplained": len(unexplained), "unexplained_examples": unexplained[:EXAMPLES]}

    # --- limits ----------------------------------------------------------------------------

    def limits(self, limit: int, left: dict[str, tuple[int, int]]) -> dict[str, Any]:
        """Per limit key (acknowledged jobs that named one): the most executions of its runs at
        once, from the sink's start and end times.  An execution a kill cut short ends at the
        kill; one of a duplicate pair (as duplicates() counts them) or a stale one (an older
        attempt begun after a newer attempt of its run had started), whose worker (or Redis) a
        stall, freeze or dropped connection disturbed while it ran or within the visibility
        timeout before it began, is left out, explained: its run may have been reclaimed
        meanwhile while its handler still ran (at least once); one with
        neither a finish nor a kill is left out and counted (unfinished).  ``left``: each key's
        slots held and runs waiting once everything has ended (both 0 unless a slot leaked)."""
        by_key: dict[str, list[Execution]] = {}
        for a in self.acks:
            if a.limit_key:
                by_key.setdefault(a.limit_key, []).extend(self.x.get(a.run_id, ()))
        doubled = {y.id for xs in self.x.values() for prev, nxt in zip(xs, xs[1:], strict=False)
                   if prev.ok is not False for y in (prev, nxt)}
        # A stale execution: an older attempt begun after a newer one of its run had started
        # (its worker held the delivery through a fault while the run was reclaimed, and the
        # newer attempt may have failed, so it is not one of a duplicate pair).
        doubled |= {x.id for xs in self.x.values() for x in xs
                    if any(y.attempt > x.attempt and y.started_ms <= x.started_ms for y in xs)}
        most: dict[str, int] = {}
        over: list[dict[str, Any]] = []
        explained = unfinished = 0
        for key, xs in sorted(by_key.items()):
            edges: list[tuple[float, int, Execution]] = []
            for x in xs:
                kills = [f.lo_ms for f in self.faults.all if f.op.startswith("kill_")
                         and f.process == x.worker and f.lo_ms >= x.started_ms]
                end = x.ended_ms if x.ended_ms is not None else min(kills, default=INF)
                if end == INF:  # no finish and no kill: its end is unknown, it is left out
                    unfinished += 1
                    continue
                # One of a duplicate pair (duplicates: an execution after one that did not
                # fail), disturbed while it ran or shortly before it began: a worker runs an
                # entry it read at once, and one it held through a stall may run after its run
                # was reclaimed.  Any other execution is always counted.
                lo = x.started_ms - self.visibility_ms - SLACK_MS
                if x.id in doubled and any(
                        f.process in (None, x.worker) and not f.op.startswith("kill_")
                        and f.lo_ms <= end and f.hi_ms >= lo for f in self.faults.all):
                    explained += 1
                    continue
                # Within one ms (the sink's resolution), ends come first: a slot is freed by the
                # report after its handler's end, and the next run starts after that; a run that
                # started and ended within the ms overlaps what ran on from before it.
                if end <= x.started_ms:
                    edges += [(x.started_ms, 1, x), (x.started_ms, 2, x)]
                else:
                    edges += [(x.started_ms, 3, x), (end, 0, x)]
            top = 0
            running: dict[str, Execution] = {}
            for _, kind, x in sorted(edges, key=lambda e: (e[0], e[1])):
                if kind in (0, 2):
                    running.pop(x.id, None)
                    continue
                running[x.id] = x
                if len(running) > top:
                    top = len(running)
                    if top > limit:
                        over.append({"key": key, "at_once": top, "executions": [
                            {"run": y.run_id, **_row(y)} for y in running.values()]})
            most[key] = top
        leaked = {k: v for k, v in left.items() if v != (0, 0)}
        return {"keys": len(by_key), "limit": limit, "most_at_once": most,
                "over_limit": len(over), "over_limit_examples": over[:EXAMPLES],
                "explained_executions": explained, "unfinished_executions": unfinished,
                "left_in_flight": leaked}

    # --- stale writes and agreement ------------------------------------------------------

    def stale(self) -> list[dict[str, Any]]:
        return stale_writes(self.h, self.faults, self.x, self.visibility_ms, self.heartbeat_ms)

    def _accepted_ok(self, rid: str, worker: str | None, attempt: int) -> str | None:
        """None when the recorded success matches the sink; else what is wrong."""
        xs = self.x.get(rid, [])
        match = [x for x in xs if x.worker == worker and x.attempt == attempt and x.ok]
        if not match:
            return "no ok execution by the recorded worker and attempt"
        end = match[-1].ended_ms or 0
        newer = [x for x in xs if x.attempt > attempt and x.started_ms < end]
        if newer:
            return f"attempt {newer[0].attempt} by {newer[0].worker} had started before it ended"
        return None

    def agreement(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Client.get / runs and the runs' recorded outcomes against the sink."""
        acks = self.acks
        if self.sample is not None and len(acks) > self.sample:
            step = len(acks) / self.sample
            acks = [acks[int(i * step)] for i in range(self.sample)]
        c = self.client
        wrong: list[dict[str, Any]] = []
        stale: list[dict[str, Any]] = []
        excused = 0
        cron_runs = [rid for j in self.crons for rid in self.x if rid.startswith(j["id"] + "@")]
        rids = [a.run_id for a in acks] + cron_runs
        runs = dict(zip(rids, c.run(c.op_read_runs(rids)), strict=True))
        for a in acks:
            problem = self._check_job(a, runs.get(a.run_id))
            if problem:
                xs = self.x.get(a.run_id, [])
                lo = min((x.started_ms for x in xs), default=a.ack_ms)
                hi = max((x.ended_ms or x.started_ms for x in xs), default=a.ack_ms)
                if self.faults.rolled_back(min(lo, a.ack_ms), hi + SLACK_MS):
                    excused += 1
                    continue
                row = {"job": a.job_id, "run": a.run_id, "problem": problem,
                       "executions": [_row(x) for x in xs],
                       "events": self.h.runs.get(a.run_id, [])}
                (stale if problem.startswith("accepted:") else wrong).append(row)
        for rid in cron_runs:
            run = runs[rid]
            if run is None or run.state.value != "succeeded":
                continue
            why = self._accepted_ok(rid, run.worker, run.attempt)
            xs = self.x[rid]
            if why and not self.faults.rolled_back(xs[0].started_ms, (xs[-1].ended_ms or 0)
                                                   + SLACK_MS):
                stale.append({"run": rid, "problem": "accepted: " + why,
                              "executions": [_row(x) for x in xs],
                              "events": self.h.runs.get(rid, [])})
        checked = {"jobs": len(acks), "cron_runs": len(cron_runs),
                   "disagreements": len(wrong), "explained_by_redis_loss": excused,
                   "examples": wrong[:EXAMPLES]}
        for s in stale:
            s["kind"] = "final_state_without_execution"
        return checked, stale

    def _check_job(self, a: Ack, run: Any) -> str | None:
        ok = self.ok_run(a.run_id)
        try:
            job = self.client.get(a.job_id)
        except NotFound:
            return "job unknown to Client.get" if ok else None  # lost: counted there
        if job.status.value == "dead":
            return None
        if ok != (job.status.value == "completed"):
            return f"Client.get status {job.status.value}, sink ok {ok}"
        if run is None or not ok:
            return None
        if run.state.value != "succeeded":
            return f"run state {run.state.value} though the sink shows a success"
        why = self._accepted_ok(a.run_id, run.worker, run.attempt)
        if why:
            return "accepted: " + why
        attempts = self.client.runs(a.job_id)
        top = attempts[0] if attempts else None
        if top is None or (top.status, top.worker, top.attempt) != ("succeeded", run.worker,
                                                                    run.attempt):
            return f"Client.runs newest {top} differs from the run's recorded outcome"
        fails = {(x.worker, x.attempt) for x in self.x.get(a.run_id, []) if x.ok is False}
        for att in attempts[1:]:
            if att.status == "failed" and (att.worker, att.attempt) not in fails:
                return f"Client.runs shows attempt {att.attempt} failed on {att.worker}, " \
                       "the sink has no such failure"
        return None

    # --- cron ----------------------------------------------------------------------------

    def cron(self) -> dict[str, Any]:
        """Each occurrence from the job's first until 3 s before its pause ran, or its catch-up
        window explains why not: the claim that moved past it came more than the window after it
        (that claim dispatched the next occurrence that ran, so its dispatch time bounds it)."""
        expected = once = twice = 0
        missing, skipped_by_window = [], 0
        for j in self.crons:
            sched = parse_cron(j["cron"], j["tz"])
            occurrences, s = [], j["first_ms"]
            while s <= j["paused_ms"]:
                occurrences.append(s)
                s = sched.next_after(s)
            later_ms: int | None = None  # dispatch of the nearest later occurrence that ran
            for s in reversed(occurrences):
                rid = f"{j['id']}@{s}"
                n = len(self.x.get(rid, []))
                counted = s <= j["paused_ms"] - 3000
                expected += counted
                if n:
                    once += counted and n == 1
                    twice += counted and n > 1
                    later_ms = self.h.dispatched_ms.get(rid)
                    if later_ms is None:
                        later_ms = self.x[rid][0].started_ms  # its events were rolled back
                elif not counted:
                    continue
                elif later_ms is not None and later_ms - s > j["window_ms"]:
                    skipped_by_window += 1
                else:
                    missing.append({"job": j["id"], "tz": j["tz"], "occurrence_ms": s,
                                    "window_ms": j["window_ms"],
                                    "next_run_dispatched_ms": later_ms})
        return {"jobs": len(self.crons), "expected": expected, "once": once,
                "more_than_once": twice, "skipped_by_window": skipped_by_window,
                "missing": len(missing), "missing_examples": missing[:EXAMPLES]}

    # --- timing --------------------------------------------------------------------------

    def lags(self) -> dict[str, int]:
        return _pct([self.x[a.run_id][0].started_ms - _sched(a.run_id)
                     for a in self.acks if a.run_id in self.x])

    def late_starts(self) -> dict[str, Any]:
        """The recovery bound: a job no fault touched starts at most HEALTHY_LATE_MS after it
        was due, one a single process fault touched at most FAULT_LATE_MS; jobs a Redis fault
        or two overlapping faults touched are counted apart (their delay has no bound here).
        A fault touches a job when it began before the job's first start and ended less than
        FAULT_LATE_MS before the job was due (after that, everything has been taken over)."""
        spans = [(f["t0"], f.get("t1", f["t0"]), f["op"].startswith("redis_"))
                 for f in self.faults.log if "t0" in f]
        out: dict[str, Any] = {"over_5s": 0, "redis": 0, "overlapping": 0, "over_bound": 0,
                               "examples": []}
        for a in self.acks:
            if a.run_id not in self.x:
                continue
            due, start = _sched(a.run_id), self.x[a.run_id][0].started_ms
            late = start - due
            out["over_5s"] += late > FAULT_LATE_MS
            touching = [redis for t0, t1, redis in spans
                        if t0 <= start and t1 + FAULT_LATE_MS >= due]
            if any(touching):
                out["redis"] += 1
            elif len(touching) > 1:
                out["overlapping"] += 1
            elif late > (FAULT_LATE_MS if touching else HEALTHY_LATE_MS):
                out["over_bound"] += 1
                if len(out["examples"]) < EXAMPLES:
                    out["examples"].append({"run": a.run_id, "late_ms": late,
                                            "faults_touching": len(touching)})
        return out

    def recoveries(self) -> list[dict[str, Any]]:
        out = []
        starts = sorted(x.started_ms for xs in self.x.values() for x in xs)
        for f in self.faults.log:
            if not f["op"].startswith("redis_"):
                continue
            ready = f["t1"]
            first = next((t for t in starts if t >= ready), None)
            backlog = [xs[0].started_ms for rid, xs in self.x.items()
                       if f["t0"] <= _sched(rid) <= ready]
            out.append({"op": f["op"], "down_s": round((ready - f["t0"]) / 1000, 2),
                        "aof_load_s": f.get("load_s"), "window_ms": f.get("window_ms"),
                        "first_execution_s": round((first - ready) / 1000, 2) if first else None,
                        "outage_backlog_started_s":
                            round((max(backlog) - ready) / 1000, 2) if backlog else None})
        return out


def _row(x: Execution) -> dict[str, Any]:
    return {"worker": x.worker, "attempt": x.attempt, "start_ms": x.started_ms,
            "end_ms": x.ended_ms, "ok": x.ok}
