-- run_attempts: one row per attempt of a run, folded from its events (both dialects).
-- An attempt is (run_id, replays, attempt): replaying a dead letter counts attempts from 1
-- again, so `replays` (replayed events before it in the run) keeps the rounds apart.  A skipped
-- occurrence (misfire policy) is attempt 0.  Outcomes, strongest first: succeeded, timed_out,
-- failed, abandoned (a failed attempt whose retry was abandoned on cancel stays failed).
-- rsched.archive.history folds events the same way in Python; a test holds the two together.
CREATE VIEW run_attempts AS
SELECT
    job_id,
    run_id,
    replays,
    n AS attempt,
    min(sched_ms) AS sched_ms,
    min(job_type) AS job_type,
    min(queue) AS queue,
    CASE
        WHEN max(CASE WHEN event = 'succeeded' THEN 1 ELSE 0 END) = 1 THEN 'succeeded'
        WHEN max(CASE WHEN event = 'timed_out' THEN 1 ELSE 0 END) = 1 THEN 'timed_out'
        WHEN max(CASE WHEN event = 'failed' THEN 1 ELSE 0 END) = 1 THEN 'failed'
        WHEN max(CASE WHEN event = 'abandoned' THEN 1 ELSE 0 END) = 1 THEN 'abandoned'
        WHEN max(CASE WHEN event = 'dead_lettered' THEN 1 ELSE 0 END) = 1 THEN 'dead'
        WHEN max(CASE WHEN event = 'skipped' THEN 1 ELSE 0 END) = 1 THEN 'skipped'
        WHEN max(CASE WHEN event = 'started' THEN 1 ELSE 0 END) = 1 THEN 'running'
        ELSE 'dispatched'
    END AS status,
    max(CASE WHEN event = 'dead_lettered' THEN 1 ELSE 0 END) AS dead_lettered,
    min(CASE WHEN event = 'dispatched' THEN ts_ms END) AS dispatched_ms,
    min(CASE WHEN event = 'started' THEN ts_ms END) AS started_ms,
    min(CASE WHEN event IN ('succeeded', 'timed_out', 'failed', 'abandoned', 'dead_lettered',
                            'skipped') THEN ts_ms END) AS ended_ms,
    max(duration_ms) AS duration_ms,
    coalesce(max(CASE WHEN event = 'started' THEN worker END),
             max(CASE WHEN event IN ('succeeded', 'timed_out', 'failed', 'abandoned')
                      THEN worker END)) AS worker,
    max(CASE WHEN event = 'started' THEN fence END) AS fence,
    coalesce(max(CASE WHEN event IN ('timed_out', 'failed') THEN error END),
             max(CASE WHEN event = 'abandoned' THEN error END),
             max(CASE WHEN event IN ('dead_lettered', 'skipped') THEN error END)) AS error,
    max(CASE WHEN event = 'succeeded' THEN result END) AS result,
    max(retry_at_ms) AS retry_at_ms,
    min(sid_ms) AS first_sid_ms
FROM (
    SELECT e.*,
           coalesce(e.attempt, 0) AS n,
           sum(CASE WHEN e.event = 'replayed' THEN 1 ELSE 0 END)
               OVER (PARTITION BY e.job_id, e.run_id ORDER BY e.sid_ms, e.sid_seq) AS replays
    FROM events e
    WHERE e.run_id IS NOT NULL
) ev
WHERE event NOT IN ('triggered', 'replayed', 'fenced')
GROUP BY job_id, run_id, replays, n;
