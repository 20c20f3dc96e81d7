"""The scripts a worker runs on the runs it holds: start, complete, heartbeat, park and expire.
One function per script builds its calls (KEYS and ARGV in the order of the script's header,
one call per partition) from the runs as the worker holds them, and a small parser per script
turns a reply into core.codes values.  A change to a script's arguments touches the .lua file
and the function here, nothing in the engine.

complete is the hottest path of all: its builder does the per-run work its argument layout
asks for and nothing more, and its reply (a CompleteCode value per run) is compared as plain
ints by the reporter, one run at a time.

Every call passes now_ms 0: the script stamps Redis's clock (each header's ARGV now_ms).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any, Protocol, TypeVar

from rsched.core.codes import ExpireCode, HeartbeatCode, ParkCode
from rsched.core.settings import Settings
from rsched.rdb import keys
from rsched.rdb.scripts import Call

# start.lua's 'reclaimed' per run: a fresh entry, one taken by XAUTOCLAIM, one taken from the
# runs of its type set aside (park.lua).
FRESH, RECLAIMED, ADOPTED = 0, 1, 2


class HeldRun(Protocol):
    """What the scripts need of a run a worker holds (rsched.engine.worker.inflight.Inflight)."""

    partition: int
    stream: str  # the queue stream it was read from
    entry_id: str
    run_id: str
    job_id: str
    run_key: str  # the job key for a one-off job's own run
    job_key: str
    fence: int  # its token once started, 0 before
    t0: float  # perf_counter when it was taken
    type: str  # its job type


class Finished(Protocol):
    """A finished attempt as complete.lua records it (rsched.engine.worker.inflight.Outcome)."""

    @property
    def fl(self) -> HeldRun: ...
    status: str  # succeeded | failed | timed_out | cancelled
    duration_ms: int
    text: str
    delay_ms: int


F = TypeVar("F", bound=Finished)


@cache
def _complete_keys(p: int) -> tuple[str, ...]:
    """complete.lua's partition keys, built once per partition."""
    return keys.events(p), keys.stats(p), keys.retry(p), keys.dead(p)


def complete(worker_id: str, s: Settings, batch: Iterable[F], now: float
             ) -> tuple[list[Call], list[tuple[int, list[F]]]]:
    """complete.lua's calls for the finished attempts ``batch``, one per partition (and per
    retention, with RSCHED_QUEUE_RETENTION_MS), and each call's partition and attempts in the
    order of its replies; ``now``: perf_counter (a run's elapsed time
    is counted from its t0).  A run not started yet goes with fence 0, and the script records
    its start with its outcome.  Runs are grouped by stream and by kind, so the stream key goes
    once per group and a one-off job's own run needs only its job key (its run and history
    live there), and a group whose runs all succeeded leaves out their outcome and retry delay:
    7 arguments a run instead of 12."""
    by_part: dict[tuple[int, tuple[int, int]], dict[tuple[str, bool], list[F]]] = defaultdict(
        lambda: defaultdict(list))
    kept = (s.run_ttl_ms, s.finished_ttl_ms)
    for o in batch:
        fl = o.fl
        if s.queue_retention_ms:  # a call per partition and retention
            kept = s.retention_of(keys.queue_of(fl.stream))
        by_part[(fl.partition, kept)][(fl.stream, fl.run_key == fl.job_key)].append(o)
    calls: list[Call] = []
    parts: list[tuple[int, list[F]]] = []
    for (p, (run_ttl_ms, finished_ttl_ms)), groups in by_part.items():
        ks = list(_complete_keys(p))
        args: list[Any] = [worker_id, 0, s.events_maxlen, keys.GROUP, len(groups),
                           s.history_len, run_ttl_ms, finished_ttl_ms]
        run_ks: list[str] = []
        run_args: list[Any] = []
        ordered: list[F] = []
        parts.append((p, ordered))
        for (stream, own), items in groups.items():
            ks.append(stream)
            ok = all(o.status == "succeeded" for o in items)
            args += [len(items), ("1" if own else "0") + ("s" if ok else "")]
            for o in items:
                fl = o.fl
                if own:
                    run_ks.append(fl.job_key)
                else:
                    run_ks += [fl.run_key, fl.job_key, keys.history(p, fl.job_id)]
                run_args += [fl.run_id, fl.fence, o.duration_ms, o.text, fl.entry_id,
                             int((now - fl.t0) * 1000)]
                if not ok:
                    run_args += [o.status, o.delay_ms]
            ordered += items
        calls.append(("complete", ks + run_ks, args + run_args))
    return calls, parts


def start(worker_id: str, s: Settings, by_part: Mapping[int, Sequence[HeldRun]], mode: int,
          now: float) -> list[Call]:
    """start.lua's calls, one per partition of ``by_part``; ``mode``: FRESH, RECLAIMED or
    ADOPTED (its 'reclaimed' value); ``now``: perf_counter."""
    calls: list[Call] = []
    for p, runs in by_part.items():
        ks = [keys.events(p), keys.stats(p), keys.dead(p), keys.retry(p)]
        args: list[Any] = [worker_id, 0, s.events_maxlen, keys.GROUP, len(runs), s.history_len,
                           keys.PARKED_CONSUMER]
        for fl in runs:
            ks += [fl.run_key, fl.job_key, fl.stream, keys.history(p, fl.job_id)]
            args += [fl.run_id, fl.entry_id, int((now - fl.t0) * 1000), mode]
        calls.append(("start", ks, args))
    return calls


def started(reply: Any) -> list[tuple[int, int]]:
    """start.lua's reply: (fence, attempt) per run; a fence > 0 is the run's token, else a
    StartFence value."""
    return [(int(reply[i]), int(reply[i + 1])) for i in range(0, len(reply) - 1, 2)]


def heartbeat(worker_id: str, events_maxlen: int,
              by_part: Mapping[int, Sequence[tuple[HeldRun, str]]]) -> list[Call]:
    """heartbeat.lua's calls, one per partition of ``by_part``: started runs (their fence),
    each with its new progress ('' for none)."""
    calls: list[Call] = []
    for p, runs in by_part.items():
        ks: list[str] = [keys.events(p), keys.stats(p)]
        args: list[Any] = [worker_id, 0, keys.GROUP, len(runs), events_maxlen]
        for fl, progress in runs:
            ks += [fl.run_key, fl.job_key, fl.stream]
            args += [fl.run_id, fl.fence, fl.entry_id, progress]
        calls.append(("heartbeat", ks, args))
    return calls


def heartbeat_codes(reply: Any) -> list[HeartbeatCode]:
    """heartbeat.lua's reply: a code per run."""
    return [HeartbeatCode(int(c)) for c in reply]


def park(worker_id: str, events_maxlen: int, wait_ms: int, visibility_ms: int,
         by_part: Mapping[int, Sequence[tuple[HeldRun, int]]]) -> list[Call]:
    """park.lua's calls, one per partition of ``by_part``: per run its served_ms (-1: a live
    worker serves its type on its queue now, else the last time one did, 0: never)."""
    calls: list[Call] = []
    for p, runs in by_part.items():
        ks: list[str] = [keys.events(p), keys.stats(p), keys.dead(p), keys.retry(p)]
        args: list[Any] = [worker_id, 0, events_maxlen, keys.GROUP, len(runs), wait_ms,
                           visibility_ms, keys.PARKED_CONSUMER]
        for fl, served_ms in runs:
            ks += [fl.run_key, fl.job_key, fl.stream]
            args += [fl.run_id, fl.entry_id, fl.type, served_ms]
        calls.append(("park", ks, args))
    return calls


def park_codes(reply: Any) -> list[ParkCode]:
    """park.lua's reply: a code per run."""
    return [ParkCode(int(c)) for c in reply]


def expire(run: HeldRun, events_maxlen: int) -> Call:
    """expire.lua's call: is ``run``, about to run its first attempt, past its start
    deadline?"""
    p = run.partition
    return ("expire", [run.run_key, run.job_key, run.stream, keys.dead(p), keys.events(p),
                       keys.stats(p)],
            [run.run_id, run.entry_id, 0, events_maxlen, keys.GROUP])


def expired(reply: Any) -> ExpireCode:
    """expire.lua's reply."""
    return ExpireCode(int(reply))


__all__ = ["ADOPTED", "FRESH", "RECLAIMED", "Finished", "HeldRun", "complete", "expire",
           "expired", "heartbeat", "heartbeat_codes", "park", "park_codes", "start", "started"]
