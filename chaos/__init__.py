"""A seeded, Jepsen-style fault checker for rsched (`make chaos`, `python -m chaos --help`).

Real dispatcher and worker processes run against an AOF redis-server, each through a TCP proxy
of its own; a load generator records every job the client acknowledged; handlers record every
execution in a second redis-server (the sink); a seeded nemesis kills, stops, freezes and
disconnects processes and crashes Redis (with and without losing its unsynced AOF tail); the
analyzer compares what was acknowledged, what ran and what Redis says, and prints JSON.
With `--redis cluster` the Redis under test is a 3-master + 3-replica cluster and the Redis
fault is a master's kill -9 while its replica lags (chaos.nemesis); with `--redis sentinel` it
is a primary, its replica and three Sentinels, and the primary is killed so.

Layout: config (timings), app + sink (handlers and their record), load (load generator
process), proxyd (proxy host process), fleet (processes), aof (machine-loss snapshots), nemesis
(faults and their log), faults (which fault explains what), history (events-stream checks),
analyzer (the report), runner (one seeded run), __main__ (command line).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# The test suite's servers and TCP proxy are the package tests/support (support.redis_server,
# support.tcp_proxy): tests/ goes on sys.path only so that `support` is found, as pytest does.
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))
