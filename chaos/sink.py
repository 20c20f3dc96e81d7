"""The sink: a redis-server of its own (never faulted) where handlers record every execution.

One list, one line per step: ``<execution id> <run id> <attempt> <worker id> <step> <ms>``,
step ``start`` before the handler's work, ``ok`` or ``fail`` after it.  An execution killed or
cut off mid-run leaves a start alone.  Writes go straight to the sink, not through a proxy.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

SINK_URL_ENV = "CHAOS_SINK_URL"
LOG_KEY = "chaos:executions"


@dataclass(slots=True)
class Execution:
    """One handler call, as the sink saw it; ended_ms None: it never finished."""

    id: str
    run_id: str
    attempt: int
    worker: str
    started_ms: int
    ended_ms: int | None = None
    ok: bool | None = None


class SinkWriter:
    """One client per worker process, shared by the handler threads (redis-py pools)."""

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._r: redis.Redis | None = None
        self._lock = threading.Lock()

    def _redis(self) -> redis.Redis:
        with self._lock:
            if self._r is None:
                self._r = redis.Redis.from_url(self._url or os.environ[SINK_URL_ENV])
            return self._r

    def start(self, run_id: str, attempt: int, worker: str) -> str:
        exec_id = uuid.uuid4().hex[:12]
        self._write(exec_id, run_id, attempt, worker, "start")
        return exec_id

    def finish(self, exec_id: str, run_id: str, attempt: int, worker: str, ok: bool) -> None:
        self._write(exec_id, run_id, attempt, worker, "ok" if ok else "fail")

    def _write(self, exec_id: str, run_id: str, attempt: int, worker: str, step: str) -> None:
        now_ms = int(time.time() * 1000)
        self._redis().rpush(LOG_KEY, f"{exec_id} {run_id} {attempt} {worker} {step} {now_ms}")


def read_executions(r: redis.Redis) -> dict[str, list[Execution]]:
    """Run id -> its executions, in start order."""
    by_id: dict[str, Execution] = {}
    total: int = r.llen(LOG_KEY)
    for lo in range(0, total, 50_000):
        raws: Any = r.lrange(LOG_KEY, lo, lo + 49_999)
        for raw in raws:
            exec_id, run_id, attempt, worker, step, ms = raw.decode().split(" ")
            if step == "start":
                by_id[exec_id] = Execution(exec_id, run_id, int(attempt), worker, int(ms))
            elif (x := by_id.get(exec_id)) is not None:
                x.ended_ms, x.ok = int(ms), step == "ok"
    runs: dict[str, list[Execution]] = {}
    for x in by_id.values():
        runs.setdefault(x.run_id, []).append(x)
    for xs in runs.values():
        xs.sort(key=lambda x: x.started_ms)
    return runs
