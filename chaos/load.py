"""The load generator, a process of its own: `python -m chaos.load ...` until SIGTERM.

Every 100 ms it schedules a batch of one-off jobs (quick, slow, flaky) due 0.2-1.5 s later, and
appends one line per job the client acknowledged to the ack log, flushed per batch:
``<job id> <run id> <type> <sent ms> <ack ms>``, then `` <limit key>`` for a job that names one
(--limit-keys: one in five jobs names one of that many keys of the family chaos-*).  A batch
that raised (Redis away) is not acknowledged; its jobs may exist or not, and the analyzer counts
only acknowledged ones.
On a cluster URL the client waits for a replica per write as any client does there
(RSCHED_WAIT_REPLICAS, default 1); refusals are counted by error name in `<ack log>.refused`
(JSON, written at exit).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import redis

from rsched import Client, JobSpec, RschedError
from rsched.core.ids import run_id as make_run_id

TICK_S = 0.1
MIX = (("quick", 80), ("slow", 5), ("flaky", 15))


LIMIT_FAMILY = "chaos-*"  # the keys of limited jobs: chaos-0, chaos-1, ...
LIMITED_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Ack:
    job_id: str
    run_id: str
    type: str
    sent_ms: int
    ack_ms: int
    limit_key: str | None = None


def refused_path(acks: Path) -> Path:
    return acks.with_name(acks.name + ".refused")


def read_refused(acks: Path) -> dict[str, int]:
    """Schedule calls or jobs refused, by error name (empty before the load generator exits)."""
    p = refused_path(acks)
    return dict(json.loads(p.read_text())) if p.exists() else {}


def read_acks(path: Path) -> list[Ack]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) in (5, 6):  # a line cut short cannot happen (written whole): be strict
            out.append(Ack(parts[0], parts[1], parts[2], int(parts[3]), int(parts[4]),
                           parts[5] if len(parts) == 6 else None))
    return out


def _spec(rng: random.Random, now_ms: int, args: argparse.Namespace) -> JobSpec:
    kind = rng.choices([k for k, _ in MIX], [w for _, w in MIX])[0]
    payload: dict[str, float | int] = {}
    if kind == "slow":
        payload["s"] = round(rng.uniform(args.slow_lo, args.slow_hi), 2)
    elif kind == "flaky":
        payload["fail"] = rng.randint(1, 2)
    key = None
    if args.limit_keys and rng.random() < LIMITED_SHARE:
        key = LIMIT_FAMILY[:-1] + str(rng.randrange(args.limit_keys))
    return JobSpec(type=kind, payload=payload, run_at=now_ms + rng.randint(200, 1500),
                   max_attempts=args.max_attempts, backoff_base_ms=200, backoff_cap_ms=1000,
                   limit_key=key)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.load")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rate", type=int, default=150)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow-lo", type=float, default=2.5)
    p.add_argument("--slow-hi", type=float, default=3.5)
    p.add_argument("--max-attempts", type=int, default=10)
    p.add_argument("--limit-keys", type=int, default=0,
                   help="one in five jobs names one of this many limit keys (chaos-0, ...)")
    args = p.parse_args(argv)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rng = random.Random(args.seed)
    if args.redis_url.startswith("redis://"):
        client = Client(redis=redis.Redis.from_url(args.redis_url, socket_timeout=5))
    else:  # the connection factory, with the durability setting from the environment
        client = Client(args.redis_url)
    per_tick = max(1, round(args.rate * TICK_S))
    errors = 0
    refused: Counter[str] = Counter()
    with open(args.out, "a") as out:
        nxt = time.monotonic()
        while not stop:
            sent_ms = int(time.time() * 1000)
            specs = [_spec(rng, sent_ms, args) for _ in range(per_tick)]
            try:
                jobs = client.schedule_many(specs)
            except (redis.RedisError, RschedError, OSError) as e:
                errors += 1
                refused[type(e).__name__] += 1
                if errors % 20 == 1:
                    print(f"schedule failed ({errors} so far): {e}", file=sys.stderr, flush=True)
                jobs = []
            ack_ms = int(time.time() * 1000)
            lines = [f"{j.id} {make_run_id(j.id, j.next_ms or 0)} {s.type} {sent_ms} {ack_ms}"
                     + (f" {s.limit_key}\n" if s.limit_key else "\n")
                     for j, s in zip(jobs, specs, strict=False) if not isinstance(j, Exception)]
            refused.update(type(j).__name__ for j in jobs if isinstance(j, Exception))
            out.write("".join(lines))
            out.flush()
            nxt += TICK_S
            time.sleep(max(0.0, nxt - time.monotonic()))
    client.close()
    refused_path(args.out).write_text(json.dumps(refused))
    return 0


if __name__ == "__main__":
    sys.exit(main())
