"""The short run of the fault checker (`python -m chaos`, see chaos/ and
docs/internals/fault-checker.md): 45 s of load and faults with a fixed seed, real processes, then
its JSON report.

The long run is `make chaos` (several seeds, 10 minutes and more).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(170)]

ROOT = Path(__file__).resolve().parents[2]
SEED = 1
# Draining waits until everything acknowledged has ended, up to this: past the visibility
# timeout (30 s, the backstop that recovers a run a Redis data loss left pending under a live
# worker) plus a slow job.
DRAIN_S = "45"
KINDS = {"kill_worker", "kill_dispatcher", "stop_worker", "stop_dispatcher", "freeze_worker",
         "freeze_dispatcher", "drop", "redis_kill", "redis_lose"}


def test_a_seeded_minute_of_faults_loses_no_job_and_accepts_no_stale_write(
    redis_available: None, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "chaos", "run", "--seed", str(SEED), "--duration", "45",
         "--drain", DRAIN_S, "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=160, check=False,
    )
    assert done.stdout, done.stderr[-3000:]
    report = json.loads(done.stdout)
    print("CHAOS checker " + json.dumps({k: report[k] for k in (
        "acknowledged", "lost_in_aof_window", "duplicates", "cron", "redis_restarts",
        "seconds")}))
    summary = {
        "lost": report["lost"]["count"],
        "unexplained duplicates": report["duplicates"]["unexplained"],
        "stale writes accepted": report["stale_writes_accepted"]["count"],
        "exited on their own": len(report["exited_on_their_own"]),
        "cron missing": report["cron"]["missing"],
        "disagreements": report["agreement"]["disagreements"],
    }
    evidence = json.dumps({k: report[k] for k in ("lost", "duplicates", "stale_writes_accepted",
                                                  "exited_on_their_own", "agreement")})[:6000]
    assert summary == dict.fromkeys(summary, 0), evidence
    assert done.returncode == 0 and report["ok"], report["failures"]
    # The run checked something: load flowed, every kind of fault happened, the machine loss
    # really lost its unsynced tail, and nothing it lost was older than the window.
    assert report["acknowledged"] > 3000
    assert set(report["faults"]) == KINDS
    assert report["cron"]["expected"] > 100 and report["cron"]["once"] > 0
    window = report["lost_in_aof_window"]
    assert window["max_before_kill_ms"] is None or window["max_before_kill_ms"] <= 1100
    assert all(r["first_execution_s"] is not None for r in report["redis_restarts"])
