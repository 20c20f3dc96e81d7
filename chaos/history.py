"""Checks on the events streams (`rsched:{pN}:events`): every state change of every run, in the
order its partition's scripts ran.

Stale writes accepted, as checked here:

* `outcome_not_from_latest_start`: an outcome (succeeded, failed, timed_out) recorded for a
  worker and attempt other than the run's latest start since its last dispatch.  Fencing exists
  to reject exactly those reports.
* `outcome_started_a_running_run`: an outcome that records its own start (a run started and
  finished within one report) although the run had already been started since its dispatch: such
  a start is only valid on a run still `dispatched`.
* `live_attempt_abandoned`: an `abandoned` event for an attempt whose worker no logged fault
  disturbed during the visibility timeout before it (neither killed, stopped, frozen,
  disconnected, nor Redis down): a live, heartbeating attempt was taken away.  (An abandoned
  attempt that never recorded its start names no worker; the worker is then the one the sink
  shows running that attempt.)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import redis

from rsched.archive.events import expand
from rsched.rdb import keys

from .faults import Faults
from .sink import Execution

OUTCOMES = ("succeeded", "failed", "timed_out")
SLACK_MS = 1500


@dataclass(slots=True)
class History:
    runs: dict[str, list[dict[str, str]]] = field(default_factory=lambda: defaultdict(list))
    dispatched_ms: dict[str, int] = field(default_factory=dict)  # first dispatch of a run
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def read_history(r: redis.Redis, partitions: int) -> History:
    h = History()
    for p in range(partitions):
        start = "-"
        while True:
            page: Any = r.xrange(
                keys.events(p), min=start, count=5000)
            if not page:
                break
            for sid, entry in page:
                for _, f in expand(sid, entry):
                    e = {k.decode(): v.decode() for k, v in f.items()}
                    h.counts[e.get("e", "")] += 1
                    rid = e.get("r")
                    if not rid:
                        continue
                    h.runs[rid].append(e)
                    if e.get("e") == "dispatched" and rid not in h.dispatched_ms:
                        h.dispatched_ms[rid] = int(e["t"])
            start = "(" + page[-1][0].decode()
    return h


def _order_violations(rid: str, evts: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    cur: tuple[str, str] | None = None
    started = False
    for e in evts:
        kind = e.get("e")
        if kind == "dispatched":
            cur, started = None, False
        elif kind == "started":
            cur, started = (e.get("w", ""), e.get("a", "")), True
        elif kind in OUTCOMES:
            me = (e.get("w", ""), e.get("a", ""))
            if e.get("f"):  # started and finished within this report
                if started:
                    out.append({"kind": "outcome_started_a_running_run", "run": rid,
                                "event": e, "latest_start": cur})
                started = True
            elif cur != me:
                out.append({"kind": "outcome_not_from_latest_start", "run": rid, "event": e,
                            "latest_start": cur})
            cur = None
        elif kind in ("abandoned", "dead_lettered"):
            cur = None
    return out


def stale_writes(h: History, faults: Faults, executions: dict[str, list[Execution]],
                 visibility_ms: int, heartbeat_ms: int) -> list[dict[str, Any]]:
    out = []
    for rid, evts in h.runs.items():
        out += _order_violations(rid, evts)
        for i, e in enumerate(evts):
            if e.get("e") != "abandoned" or "cancel" in e.get("err", ""):
                continue
            t, attempt = int(e["t"]), int(e.get("a") or 0)
            workers = [e["w"]] if e.get("w") else sorted(
                {x.worker for x in executions.get(rid, []) if x.attempt == attempt})
            lo = t - visibility_ms - heartbeat_ms - SLACK_MS
            live = [w for w in workers if faults.hit(w, lo, t) is None]
            if live:
                taker = next((n.get("w") for n in evts[i + 1:] if n.get("e") == "reclaimed"), None)
                out.append({"kind": "live_attempt_abandoned", "run": rid, "attempt": attempt,
                            "worker": live[0], "at_ms": t, "taken_by": taker,
                            "taker_fault": _label(faults, taker, lo, t), "event": e})
    return out


def _label(faults: Faults, process: str | None, lo: float, hi: float) -> str | None:
    f = faults.hit(process, lo - 10_000, hi) if process else None
    return f.label() if f else None
