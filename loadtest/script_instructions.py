"""Redis instructions per job of the hot scripts, counted by callgrind (not moved by the load).

A private redis-server under `valgrind --tool=callgrind --instr-atstart=no`; one partition's
one-off no-op jobs, scheduled an hour ahead, are claimed by calling claim.lua directly (100 a
call), read off their queue stream, and reported by calling complete.lua directly as a worker
does: its own runs, all succeeded, fence '0' (each started in the call) in calls of K = 1, 8
and 45 runs; then start.lua (8 runs a call) and complete.lua for runs whose start it recorded.
Instrumentation is on only around each batch of calls (callgrind_control -i on / -i off), so a
figure is Redis's instructions for those calls alone, divided by the jobs or runs they handled.
A complete call with no runs gives the script's fixed cost per call (its setup), which small
batches pay per run.  Run the scripts of another checkout with --code DIR (before/after pairs
on the same inputs); --keep DIR keeps each callgrind dump there, named after its row, for
`callgrind_annotate --inclusive=yes` (where a script's instructions go).  --limit-key gives
every job a limit key under a concurrency limit it never reaches (the cost of the check alone):
each its own key of one family, or one shared key; --jobs sets how many jobs are measured
(10,000: as many keys).  --backlog N first parks N runs of another, saturated key in the
partition (the jobs measured then share it with that backlog).  Prints a table, then a last
line of JSON.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--code", type=Path, default=HERE.parent,
                help="the rsched checkout whose scripts run (default: this one)")
ap.add_argument("--port", type=int, default=7391)
ap.add_argument("--text", default="null", help="each run's result as the worker sends it")
ap.add_argument("--keep", type=Path, default=None,
                help="keep the callgrind dumps in this folder, one per row")
ap.add_argument("--limit-key", choices=("none", "distinct", "one"), default="none",
                help="give every job a limit key under a concurrency limit it never reaches: "
                     "its own (distinct: the family k-*) or one shared key (one); checkouts "
                     "without limits take only none")
ap.add_argument("--jobs", type=int, default=1_000,
                help="jobs claimed and measured (a multiple of 100; with --limit-key distinct, "
                     "as many distinct keys, and 100 more claimed unmeasured)")
ap.add_argument("--backlog", type=int, default=0,
                help="first park this many runs of one saturated key in the partition (they "
                     "wait for its limit), to see what such a backlog costs the other jobs")
A = ap.parse_args()
sys.path.insert(0, str(A.code.resolve()))

from rsched import Client, JobSpec  # noqa: E402, I001
from rsched.core.ids import partition_for_key  # noqa: E402
from rsched.core.settings import Settings  # noqa: E402
from rsched.rdb import keys, scripts  # noqa: E402

P, PARTITIONS = 0, 16
COMPLETE_SHAPES = ((1, 100), (8, 40), (45, 10))  # (runs a call, calls)
STARTS, START_K = 160, 8
CLAIM_K = 100
CLAIM_CALLS = A.jobs // CLAIM_K
JOBS = CLAIM_CALLS * CLAIM_K + 100  # the last claim call is not counted


def each(fn: Callable[..., None], batches: list[Any]) -> Callable[[], None]:
    """One call of ``fn`` per batch, as one thing to count."""
    def run() -> None:
        for b in batches:
            fn(b)
    return run


def ids_in_partition(n: int) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        if partition_for_key(f"k-{i}", PARTITIONS) == P:
            out.append(f"k-{i}")
        i += 1
    return out


class Callgrind:
    """A redis-server under callgrind; `count` runs a function with instrumentation on."""

    def __init__(self, port: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="script-instr-")
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={self.dir}/cg.out", "redis-server", "--port", str(port),
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _ctl(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def count(self, fn: Callable[[], None], name: str) -> int:
        self._ctl("-z")
        self._ctl("-i", "on")
        fn()
        self._ctl("-i", "off")
        before = set(glob.glob(f"{self.dir}/cg.out*"))
        self._ctl("-d")
        time.sleep(0.3)
        [dump] = set(glob.glob(f"{self.dir}/cg.out*")) - before
        if A.keep:
            A.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(dump, A.keep / ("cg." + "".join(c if c.isalnum() else "_" for c in name)))
        with open(dump) as f:
            for line in f:
                if line.startswith("totals:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    cg = Callgrind(A.port)
    r = redis.Redis(port=A.port)
    for _ in range(300):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.2)
    try:
        print_results(measure(r, cg))
    finally:
        cg.stop()


def measure(r: redis.Redis, cg: Callgrind) -> dict[str, float]:
    s = Settings.from_env(redis_url=f"redis://localhost:{A.port}/0", partitions=PARTITIONS)
    client = Client(settings=s)
    now = int(time.time() * 1000)
    run_at = now + 3_600_000
    names = ids_in_partition(JOBS)
    kw: list[dict[str, Any]] = [{} for _ in names]
    if A.limit_key != "none":  # a limit no job reaches: the cost of the check, not of waiting
        kw = [{"limit_key": k if A.limit_key == "distinct" else names[0]} for k in names]
        client.set_limit("k-*" if A.limit_key == "distinct" else names[0], concurrency=10 * JOBS)
    jobs = client.schedule_many([JobSpec(type="noop", run_at=run_at, idempotency_key=k, **x)
                                 for k, x in zip(names, kw, strict=True)])
    assert not any(isinstance(j, Exception) for j in jobs), jobs[:2]
    client.close()
    stream = keys.stream(P, "default")
    r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    r.hset(keys.lease(P), mapping={"owner": "d1", "fence": "7", "expires_ms": now + 10**9})
    for name in ("claim", "complete", "start"):
        r.script_load(scripts.load(name).source)
    t = run_at + 1000  # every job due

    def ev(name: str, ks: list[Any], args: list[Any]) -> Any:
        return r.evalsha(scripts.load(name).sha, len(ks), *ks, *args)

    prefix = keys.job(P, "").encode()

    def claim(once: list[bytes], dispatched: int | None = None) -> None:
        ks = [keys.lease(P), keys.due(P), keys.retry(P), keys.events(P), keys.stats(P), stream,
              *(prefix + m for m in once), keys.dead(P)]
        out = ev("claim", ks, ["d1", 7, t, 0, 1, 0, keys.GROUP, len(once), s.run_ttl_ms,
                              s.history_len, *once])
        assert int(out[0]) == (len(once) if dispatched is None else dispatched), out

    if A.backlog:
        park_backlog(r, s, now, claim)
    due: list[bytes] = list(r.zrange(keys.due(P), 0, -1))  # type: ignore[arg-type]

    res: dict[str, float] = {}
    calls = [due[i:i + CLAIM_K] for i in range(0, CLAIM_CALLS * CLAIM_K, CLAIM_K)]
    name = f"claim/job ({CLAIM_K} a call)"
    res[name] = cg.count(each(claim, calls), name) / (CLAIM_CALLS * CLAIM_K)
    claim(due[CLAIM_CALLS * CLAIM_K:])
    read: Any = r.xreadgroup(keys.GROUP, "w1", {stream: ">"}, count=10 * JOBS)
    runs = [(f[b"r"].decode(), eid.decode()) for eid, f in read[0][1]]
    assert len(runs) == JOBS

    def complete(rs: list[tuple[str, str]], fences: dict[str, str] | None = None) -> None:
        ks: list[Any] = [keys.events(P), keys.stats(P), keys.retry(P), keys.dead(P), stream]
        args: list[Any] = ["w1", t + 50, 0, keys.GROUP, 1, s.history_len, s.run_ttl_ms,
                           s.finished_ttl_ms, len(rs), "1s"]
        for rid, eid in rs:
            ks.append(keys.job(P, rid.rsplit("@", 1)[0]))
            args += [rid, (fences or {}).get(rid, "0"), 3, A.text, eid, 5]
        assert all(int(x) == 1 for x in ev("complete", ks, args))

    pos = 0
    for k, n in COMPLETE_SHAPES:
        batches = [runs[pos + i * k:pos + (i + 1) * k] for i in range(n)]
        pos += k * n
        name = f"complete/run K={k}"
        res[name] = cg.count(each(complete, batches), name) / (k * n)
    name = "complete/call, no runs"
    res[name] = cg.count(each(complete, [[]] * 100), name) / 100
    started = [runs[pos + i:pos + i + START_K] for i in range(0, STARTS, START_K)]
    fences: dict[str, str] = {}

    def start(rs: list[tuple[str, str]]) -> None:
        ks: list[Any] = [keys.events(P), keys.stats(P), keys.dead(P), keys.retry(P)]
        args: list[Any] = ["w1", t + 20, 0, keys.GROUP, len(rs), s.history_len,
                           keys.PARKED_CONSUMER]
        for rid, eid in rs:
            job_id = rid.rsplit("@", 1)[0]
            ks += [keys.job(P, job_id), keys.job(P, job_id), stream, keys.history(P, job_id)]
            args += [rid, eid, 5, "0"]
        out = ev("start", ks, args)
        for i, (rid, _) in enumerate(rs):
            assert int(out[2 * i]) > 0, out
            fences[rid] = str(out[2 * i])

    name = f"start/run K={START_K}"
    res[name] = cg.count(each(start, started), name) / STARTS
    name = f"complete, start recorded/run K={START_K}"
    res[name] = cg.count(each(lambda b: complete(b, fences), started), name) / STARTS
    return res


def park_backlog(r: redis.Redis, s: Settings, now: int,
                 claim: Callable[[list[bytes], int], None]) -> None:
    """A.backlog runs of one key of the partition, claimed while its one slot is held: each
    waits in the key's waiting set (claim.lua), as a saturated key's backlog does."""
    hot = next(f"hot-{i}" for i in range(10**6) if partition_for_key(f"hot-{i}", PARTITIONS) == P)
    client = Client(settings=s)
    client.set_limit(hot, concurrency=1)
    r.sadd(keys.limit_running(P, hot), "held-elsewhere")
    for c in range(0, A.backlog, 5000):
        jobs = client.schedule_many([JobSpec(type="noop", run_at=now - 1000, limit_key=hot)
                                     for _ in range(min(5000, A.backlog - c))])
        assert not any(isinstance(j, Exception) for j in jobs), jobs[:2]
        for k in range(0, len(jobs), 500):
            claim([j.id.encode() for j in jobs[k:k + 500]], 0)  # type: ignore[union-attr]
    client.close()
    assert r.zcard(keys.limit_waiting(P, hot)) == A.backlog


def print_results(res: dict[str, float]) -> None:
    for name, v in res.items():
        print(f"{name:36s} {v / 1000:8.1f}k")
    print(json.dumps({"code": str(A.code), "text": A.text, "limit_key": A.limit_key,
                      "backlog": A.backlog,
                      "instructions": {k: round(v) for k, v in res.items()}}))


if __name__ == "__main__":
    main()
