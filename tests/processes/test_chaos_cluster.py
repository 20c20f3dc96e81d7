"""The fault checker's cluster scenario (`python -m chaos run --redis cluster`,
docs/internals/fault-checker.md): the fleet on a 3-master + 3-replica cluster while the nemesis
kills masters whose replica lags (and freezes, drops, stops and kills processes), then the same
analysis as the single-Redis run.

Two runs: with the durability setting (WAIT for a replica, the cluster default) nothing
acknowledged may be lost; with it off (RSCHED_WAIT_REPLICAS=0) the checker must report the
acknowledged jobs the failover rolled back, or it could not tell the guarantee from its absence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos_runs import assert_failovers_lost_nothing, run_checker

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(180)]

SEED = 1  # its seeded order puts a master kill ~9 s in
KILL = "redis_master_kill"


def test_killing_cluster_masters_whose_replica_lags_loses_no_acknowledged_job(
    redis_available: None, tmp_path: Path
) -> None:
    report = run_checker(tmp_path, "cluster", SEED, 30, KILL)
    assert_failovers_lost_nothing(report, KILL, "cluster")
    # Each load batch goes to one random partition, so a 1-2 s lag sees only a few batches to
    # the victim: NotReplicated counts them, and is not required to be non-zero.
    # Frozen and dropped connections too: each process reaches the nodes through proxies of its
    # own (test_chaos_cluster_proxies.py), and seed 1's first faults include both kinds.
    assert {"freeze_worker", "freeze_dispatcher", "drop"} <= set(report["faults"]), report["faults"]


def test_without_wait_the_checker_reports_the_acknowledged_jobs_a_failover_lost(
    redis_available: None, tmp_path: Path
) -> None:
    # 30 s: with freezes and drops among the first faults, seed 1's master kill comes ~20 s in.
    report = run_checker(tmp_path, "cluster", SEED, 30, KILL, RSCHED_WAIT_REPLICAS="0")
    assert "NotReplicated" not in report["refused"]
    assert report["acknowledged_while_replica_cut_off"]["count"] > 0
    assert report["lost"]["count"] > 0, report["lost"]
    assert "lost" in report["failures"] and not report["ok"]
    assert all(not x["in_redis"] for x in report["lost"]["examples"])
