"""`python -m chaos run --seed 7 --duration 45` (one run) or `python -m chaos suite --seeds
1,2,3,4 --duration 150` (several, one after another); JSON on stdout, exit code 1 on any
failure (lost job, unexplained duplicate, stale write accepted, process exited on its own,
missing cron occurrence, final state disagreeing with the sink)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import REDIS_KINDS, RunConfig
from .runner import Run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "suite"):
        s = sub.add_parser(name)
        if name == "run":
            s.add_argument("--seed", type=int, default=1)
        else:
            s.add_argument("--seeds", default="1,2,3,4")
        s.add_argument("--duration", type=float, default=45.0, help="seconds of faults, per run")
        s.add_argument("--rate", type=int, default=150, help="one-off jobs per second")
        s.add_argument("--drain", type=float, default=45.0)
        s.add_argument("--no-faults", action="store_true")
        s.add_argument("--redis", choices=REDIS_KINDS, default="single",
                       help="single: one AOF redis-server; cluster: 3 masters + 3 replicas, "
                            "masters killed with -9; sentinel: a primary, its replica and 3 "
                            "Sentinels, the primary killed with -9")
        s.add_argument("--limit-keys", type=int, default=0,
                       help="one in five one-off jobs names one of this many limit keys, each "
                            "allowed 2 runs at once (docs/limits.md)")
        s.add_argument("--out", type=Path, default=None, help="keep logs and report here")
    args = p.parse_args(argv)
    seeds = [args.seed] if args.cmd == "run" else [int(x) for x in args.seeds.split(",")]
    reports = []
    for seed in seeds:
        cfg = RunConfig(seed=seed, duration_s=args.duration, rate_per_s=args.rate,
                        drain_s=args.drain, faults=not args.no_faults, redis=args.redis,
                        limit_keys=args.limit_keys)
        name = f"seed-{seed}" if args.redis == "single" else f"{args.redis}-seed-{seed}"
        out = args.out / name if args.out else None
        report = Run(cfg, out).execute()
        reports.append(report)
        print(f"seed {seed}: {'ok' if report['ok'] else 'FAILED ' + ', '.join(report['failures'])}"
              f" ({report['seconds']} s)", file=sys.stderr, flush=True)
    if args.cmd == "run":
        print(json.dumps(reports[0], indent=2))
    else:
        print(json.dumps({"ok": all(r["ok"] for r in reports), "runs": reports}, indent=2))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
