"""The fault checker's cluster scenario (`python -m chaos run --redis cluster`,
docs/internals/fault-checker.md): the fleet on a 3-master + 3-replica cluster while the nemesis
kills masters whose replica lags (and freezes, drops, stops and kills processes), then the same
analysis as the single-Redis run.

Two runs: with the durability setting (WAIT for a replica, the cluster default) nothing
acknowledged may be lost; with it off (RSCHED_WAIT_REPLICAS=0) the checker must report the
acknowledged jobs the failover rolled back, or it could not tell the guarantee from its absence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[2]
SEED = 1  # its seeded order puts a master kill ~9 s in


def run_checker(tmp_path: Path, duration_s: int, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "chaos", "run", "--redis", "cluster", "--seed", str(SEED),
         "--duration", str(duration_s), "--drain", "25", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=140, check=False,
        env={**os.environ, **env},
    )
    assert done.stdout, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["faults"].get("redis_master_kill", 0) >= 1, report["faults"]
    assert report["exited_on_their_own"] == [], report["exited_on_their_own"]
    return report


def test_killing_cluster_masters_whose_replica_lags_loses_no_acknowledged_job(
    redis_available: None, tmp_path: Path
) -> None:
    report = run_checker(tmp_path, 30)
    print("CHAOS cluster " + json.dumps({k: report[k] for k in (
        "acknowledged", "refused", "acknowledged_while_replica_cut_off", "lost", "duplicates",
        "cron", "redis_restarts", "start_lag_ms", "seconds")}))
    summary = {
        "lost": report["lost"]["count"],
        "unexplained duplicates": report["duplicates"]["unexplained"],
        "stale writes accepted": report["stale_writes_accepted"]["count"],
        "cron missing": report["cron"]["missing"],
        "disagreements": report["agreement"]["disagreements"],
    }
    evidence = json.dumps({k: report[k] for k in ("lost", "duplicates", "stale_writes_accepted",
                                                  "agreement")})[:6000]
    assert summary == dict.fromkeys(summary, 0), evidence
    assert report["ok"], report["failures"]
    # WAIT refused every write to a master whose replica was cut off (each load batch goes to
    # one random partition, so a 1-2 s lag sees only a few such batches: NotReplicated counts
    # them, and is not required to be non-zero).
    assert report["acknowledged_while_replica_cut_off"]["count"] == 0
    # The run checked something: load flowed, the failover rolled back work that then ran again
    # under its original run id, and the killed master's partitions came back.
    assert report["acknowledged"] > 2000
    # Frozen and dropped connections too: each process reaches the nodes through proxies of its
    # own (test_chaos_cluster_proxies.py), and seed 1's first faults include both kinds.
    assert {"freeze_worker", "freeze_dispatcher", "drop"} <= set(report["faults"]), report["faults"]
    assert report["duplicates"]["explained_by"].get("redis_master_kill", 0) > 0
    assert all(r["first_execution_s"] is not None for r in report["redis_restarts"])


def test_without_wait_the_checker_reports_the_acknowledged_jobs_a_failover_lost(
    redis_available: None, tmp_path: Path
) -> None:
    report = run_checker(tmp_path, 15, RSCHED_WAIT_REPLICAS="0")
    assert "NotReplicated" not in report["refused"]
    assert report["acknowledged_while_replica_cut_off"]["count"] > 0
    assert report["lost"]["count"] > 0, report["lost"]
    assert "lost" in report["failures"] and not report["ok"]
    assert all(not x["in_redis"] for x in report["lost"]["examples"])
