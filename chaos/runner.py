"""One seeded run: start everything, load and faults for `duration_s`, drain, analyze."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from rsched import Client, JobSpec
from rsched.core.ids import partition_for_key
from rsched.rdb import keys
from rsched.rdb.limit_scripts import op_key_state

from .analyzer import Analyzer
from .config import CRON_EXPRS, CRON_WINDOWS, CRON_ZONES, RunConfig
from .faults import Faults
from .fleet import Fleet, now_ms
from .history import read_history
from .load import LIMIT_FAMILY, Ack, read_acks, read_refused
from .nemesis import Nemesis
from .sink import LOG_KEY, read_executions


def _wait(check: Any, timeout_s: float, what: str, fleet: Fleet) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        fleet.poll()
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {timeout_s} s for {what}")
        time.sleep(0.1)


def _retrying(fn: Any, what: str, timeout_s: float = 20) -> Any:
    """Client calls right after the faults: Redis may still be loading its AOF."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except redis.RedisError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: Redis did not answer for {timeout_s} s "
                                   f"(last error: {e!r})") from None
            time.sleep(0.2)


class Run:
    def __init__(self, cfg: RunConfig, out: Path | None = None) -> None:
        self.cfg = cfg
        self.keep = out is not None
        self.out = out or Path(tempfile.mkdtemp(prefix=f"rsched-chaos-{cfg.seed}-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.acks_path = self.out / "acks.log"
        self.nemesis_path = self.out / "nemesis.jsonl"
        for p in (self.acks_path, self.nemesis_path):
            p.unlink(missing_ok=True)
        self.fleet = Fleet(cfg, self.out)
        self.crons: list[dict[str, Any]] = []

    def execute(self) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            report = self._execute()
        finally:
            self.fleet.close()
        report["seconds"] = round(time.monotonic() - t0, 1)
        (self.out / "report.json").write_text(json.dumps(report, indent=2))
        if not self.keep and report["ok"]:
            shutil.rmtree(self.out, ignore_errors=True)
        else:
            report["artifacts"] = str(self.out)
        return report

    def _execute(self) -> dict[str, Any]:
        cfg, fleet = self.cfg, self.fleet
        fleet.start_servers()
        if cfg.redis == "single":
            r = redis.Redis.from_url(fleet.redis.url, socket_timeout=10)
            client = Client(redis=r)
        else:  # the connection factory: cluster routing or Sentinel, WAIT as configured
            client = Client(fleet.redis_url)
            r = client.r
        for m in fleet.members:
            fleet.spawn(m.slot)

        def all_started() -> bool:
            pipe = r.pipeline(transaction=False)
            for m in fleet.members:
                if m.kind == "dispatcher":
                    pipe.zscore(keys.dispatchers(), m.id)
                else:
                    pipe.hexists(keys.workers(), m.id)
            return all(pipe.execute())

        _wait(all_started, 40, "every dispatcher and worker to register", fleet)
        if cfg.limit_keys:
            client.set_limit(LIMIT_FAMILY, concurrency=cfg.limit_concurrency)
        self._schedule_crons(client)
        fleet.start_load(self.acks_path)
        nemesis = Nemesis(fleet, cfg, self.nemesis_path)
        until = time.monotonic() + cfg.duration_s
        if cfg.faults:
            nemesis.run(until)
        else:
            nemesis.idle(cfg.duration_s)
        load_died = fleet.load_exited()
        fleet.stop_load()
        for j in self.crons:
            _retrying(lambda j=j: client.pause(j["id"]), "pausing a cron job")
            j["paused_ms"] = now_ms()
        drained_s = self._drain(r, client, nemesis)
        fleet.poll()
        sink = fleet.sink.client()
        executions = read_executions(sink)
        history = _retrying(lambda: read_history(r, cfg.partitions), "reading the events")
        faults = Faults(nemesis.log)
        acks = read_acks(self.acks_path)
        a = Analyzer(acks=acks, executions=executions, history=history, faults=faults,
                     client=client, crons=self.crons, visibility_ms=cfg.visibility_ms,
                     heartbeat_ms=cfg.heartbeat_ms,
                     agreement_sample=None if cfg.duration_s <= 120 else 3000,
                     vanished_is_lost=cfg.redis != "single")
        lost = a.lost()
        dups = a.duplicates()
        late = a.late_starts()
        limits = a.limits(cfg.limit_concurrency, _retrying(
            lambda: self._limits_left(client, acks), "reading the limit keys")) \
            if cfg.limit_keys else None
        stale = a.stale()
        agreement, stale_final = a.agreement()
        stale += stale_final
        for s in stale[:8]:  # evidence: what the sink and the events stream hold of the run
            s.setdefault("events", history.runs.get(s["run"], []))
            s.setdefault("executions", [asdict(x) for x in executions.get(s["run"], [])])
        report: dict[str, Any] = {
            "seed": cfg.seed, "redis": cfg.redis, "duration_s": cfg.duration_s,
            "acknowledged": len(acks),
            "acknowledged_by_type": dict(Counter(x.type for x in acks)),
            "refused": read_refused(self.acks_path),
            "acknowledged_while_replica_cut_off": a.acked_while_lagging(),
            "executions": sum(len(xs) for xs in executions.values()),
            **lost,
            "duplicates": dups,
            "stale_writes_accepted": {
                "count": len(stale), "by_kind": dict(Counter(s["kind"] for s in stale)),
                "examples": stale[:8]},
            "cron": a.cron(),
            **({"limits": limits} if limits is not None else {}),
            "agreement": agreement,
            "exited_on_their_own": fleet.exits + (
                [{"process": "load", "rc": fleet.load.returncode if fleet.load else None}]
                if load_died else []),
            "redis_restarts": a.recoveries(),
            "faults": dict(Counter(f["op"] for f in nemesis.log)),
            "start_lag_ms": a.lags(),
            "late_starts": late,
            "drained_s": drained_s,
            "events": dict(sorted(history.counts.items())),
            "config": cfg.to_json(),
        }
        failures = []
        if lost["lost"]["count"]:
            failures.append("lost")
        if dups["unexplained"]:
            failures.append("unexplained duplicates")
        if stale:
            failures.append("stale writes accepted")
        if report["exited_on_their_own"]:
            failures.append("processes exited on their own")
        if report["cron"]["missing"]:
            failures.append("cron occurrences missing")
        if late["over_bound"]:
            failures.append("jobs started later than the recovery bound")
        if agreement["disagreements"]:
            failures.append("final state disagrees with the sink")
        if limits is not None and limits["over_limit"]:
            failures.append("a key ran more than its limit at once")
        if limits is not None and limits["left_in_flight"]:
            failures.append("limit slots left held")
        report["failures"] = failures
        report["ok"] = not failures
        sink.close()
        client.close()
        return report

    def _limits_left(self, client: Client, acks: list[Ack]) -> dict[str, tuple[int, int]]:
        """Each limit key's slots held and runs waiting now (once everything has ended)."""
        out = {}
        for key in sorted({a.limit_key for a in acks if a.limit_key}):
            st = client.run(op_key_state(partition_for_key(key, self.cfg.partitions), key, 0))
            out[key] = (st.in_flight, st.waiting)
        return out

    def _schedule_crons(self, client: Client) -> None:
        rng = random.Random(self.cfg.seed)
        specs = [JobSpec(type="tick", cron=CRON_EXPRS[i % len(CRON_EXPRS)],
                         tz=CRON_ZONES[rng.randrange(len(CRON_ZONES))],
                         max_attempts=self.cfg.max_attempts, backoff_base_ms=200,
                         catch_up_window_ms=CRON_WINDOWS[i // 2 % len(CRON_WINDOWS)][0],
                         misfire=CRON_WINDOWS[i // 2 % len(CRON_WINDOWS)][1])
                 for i in range(self.cfg.cron_jobs)]
        for spec, job in zip(specs, client.schedule_many(specs), strict=True):
            if isinstance(job, Exception):
                raise job
            self.crons.append({"id": job.id, "cron": spec.cron, "tz": spec.tz,
                               "first_ms": job.next_ms, "window_ms": spec.catch_up_window_ms})

    def _drain(self, r: redis.Redis, client: Client, nemesis: Nemesis) -> float:
        """Until every acknowledged job has run to success (or is dead, or unknown to Redis)
        and no stream entry is pending, or drain_s passed; returns the seconds it took."""
        t0 = time.monotonic()
        sink = self.fleet.sink.client()
        pending = {a.run_id: a.job_id for a in read_acks(self.acks_path)}
        seen = 0
        while time.monotonic() - t0 < self.cfg.drain_s:
            nemesis.idle(0.5)
            lines: Any = sink.lrange(LOG_KEY, seen, -1)
            seen += len(lines)
            for raw in lines:
                _, rid, _, _, step, _ = raw.decode().split(" ")
                if step == "ok":
                    pending.pop(rid, None)
            try:
                if len(pending) < 2000:
                    rids = list(pending)
                    for rid, run in zip(rids, client.run(client.op_read_runs(rids)),
                                        strict=True):
                        if run is None or run.state.value == "dead":
                            pending.pop(rid)
                if not pending and self._streams_idle(r):
                    break
            except redis.RedisError:
                continue
        sink.close()
        return round(time.monotonic() - t0, 1)

    def _streams_idle(self, r: redis.Redis) -> bool:
        pipe = r.pipeline(transaction=False)
        for p in range(self.cfg.partitions):
            pipe.xpending(keys.stream(p, "default"), keys.GROUP)
            pipe.zcard(keys.retry(p))
        res = pipe.execute(raise_on_error=False)
        return all(not isinstance(x, Exception) and
                   (x == 0 if isinstance(x, int) else x["pending"] == 0) for x in res)
