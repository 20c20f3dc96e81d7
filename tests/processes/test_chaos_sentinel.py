"""The fault checker's Sentinel scenario (`python -m chaos run --redis sentinel`,
docs/internals/fault-checker.md): the fleet on a primary, its replica and three Sentinels while
the nemesis kills the primary with its replica cut off (and stops and kills processes), then the
same analysis as the cluster run: nothing acknowledged may be lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos_runs import assert_failovers_lost_nothing, run_checker

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(200)]

SEED = 3  # its seeded order puts the primary's kill ~10 s in, among process faults


def test_killing_the_sentinel_primary_whose_replica_lags_loses_no_acknowledged_job(
    redis_available: None, tmp_path: Path
) -> None:
    report = run_checker(tmp_path, "sentinel", SEED, 30, "redis_primary_kill")
    assert_failovers_lost_nothing(report, "redis_primary_kill", "sentinel")
    # Until the old primary rejoins as its replica the promoted one has none: every write
    # waiting for a replica is refused meanwhile, never acknowledged.
    assert report["refused"].get("NotReplicated", 0) > 0, report["refused"]
