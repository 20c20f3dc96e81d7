"""The fault checker run as a process by the cluster and Sentinel scenario tests, and what
both require of a run whose failovers must lose nothing acknowledged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_checker(tmp_path: Path, redis: str, seed: int, duration_s: int, fault: str,
                **env: str) -> dict[str, Any]:
    """`python -m chaos run --redis <redis>`'s report; its Redis `fault` happened at least once
    and no process exited on its own."""
    done = subprocess.run(
        [sys.executable, "-m", "chaos", "run", "--redis", redis, "--seed", str(seed),
         "--duration", str(duration_s), "--drain", "45", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=duration_s + 130, check=False,
        env={**os.environ, **env},
    )
    assert done.stdout, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["faults"].get(fault, 0) >= 1, report["faults"]
    assert report["exited_on_their_own"] == [], report["exited_on_their_own"]
    return report


def assert_failovers_lost_nothing(report: dict[str, Any], fault: str, label: str) -> None:
    """Nothing acknowledged lost, every duplicate explained, nothing stale accepted, no cron
    occurrence missing, the final state as the sink saw it; and the run checked something:
    load flowed, `fault` rolled back work that ran again under its run id, executions
    resumed after each failover."""
    print(f"CHAOS {label} " + json.dumps({k: report[k] for k in (
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
    # WAIT refused every write to a primary whose replica was cut off.
    assert report["acknowledged_while_replica_cut_off"]["count"] == 0
    assert report["acknowledged"] > 2000
    assert report["duplicates"]["explained_by"].get(fault, 0) > 0
    assert all(r["first_execution_s"] is not None for r in report["redis_restarts"])
