"""What the jobs list shows of each job's runs: the latest run's status and time, and the current
failure streak, read for a page of jobs in two round trips, off the hot path.

Nothing on the write path keeps a streak: it is counted (rsched.core.last_run.fold) from what
Redis already holds, the latest run (its hash, or for a one-off job's own run the job hash) and
the job's bounded history list, newest first, up to STREAK_SCAN attempt records (the history
list holds at most RSCHED_HISTORY_LEN).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from rsched.core.last_run import LAST_RUN_FILTERS, LastRun, check_filter, fold, plain_run
from rsched.core.models import Job
from rsched.rdb.job_reads import op_latest_runs, op_run_states
from rsched.rdb.ops import Op

STREAK_SCAN = 50  # attempt records read per job


def op_last_runs(jobs: Sequence[Job]) -> Op[list[LastRun]]:
    """The latest run and failure streak of each job, in the jobs' order."""
    got = yield from op_latest_runs([(j.partition, j.id) for j in jobs], STREAK_SCAN)
    own = [fields for fields, _ in got]
    hist = [[json.loads(raw) for raw in raws] for _, raws in got]
    plain = [i for i, j in enumerate(jobs) if plain_run(j.last_run_id, own[i][0])]
    runs = yield from op_run_states([(jobs[i].partition, jobs[i].last_run_id or "")
                                     for i in plain])
    latest = dict(zip(plain, runs, strict=True))
    return [fold(j.last_run_id, own[i], latest.get(i), hist[i], STREAK_SCAN)
            for i, j in enumerate(jobs)]


__all__ = ["LAST_RUN_FILTERS", "STREAK_SCAN", "LastRun", "check_filter", "op_last_runs"]
