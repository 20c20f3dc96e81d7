-- run_attempts, version 2: an attempt's start is its 'started' event or, for a run that started
-- and finished within one worker report, the start time and fence its outcome event carries
-- (0003_started_ms); 'cancelled' (a run overlap cancelPrevious stopped) is an outcome after
-- succeeded, its error shown like an abandoned attempt's.  Otherwise as 0002_run_attempts.sql;
-- rsched.archive.history folds events the same way in Python, and a test holds the two together.
DROP VIEW run_attempts;
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
        WHEN max(CASE WHEN event = 'cancelled' THEN 1 ELSE 0 END) = 1 THEN 'cancelled'
        WHEN max(CASE WHEN event = 'timed_out' THEN 1 ELSE 0 END) = 1 THEN 'timed_out'
        WHEN max(CASE WHEN event = 'failed' THEN 1 ELSE 0 END) = 1 THEN 'failed'
        WHEN max(CASE WHEN event = 'abandoned' THEN 1 ELSE 0 END) = 1 THEN 'abandoned'
        WHEN max(CASE WHEN event = 'dead_lettered' THEN 1 ELSE 0 END) = 1 THEN 'dead'
        WHEN max(CASE WHEN event = 'skipped' THEN 1 ELSE 0 END) = 1 THEN 'skipped'
        WHEN max(CASE WHEN event = 'started' OR started_ms IS NOT NULL THEN 1 ELSE 0 END) = 1
            THEN 'running'
        ELSE 'dispatched'
    END AS status,
    max(CASE WHEN event = 'dead_lettered' THEN 1 ELSE 0 END) AS dead_lettered,
    min(CASE WHEN event = 'dispatched' THEN ts_ms END) AS dispatched_ms,
    coalesce(min(CASE WHEN event = 'started' THEN ts_ms END), min(started_ms)) AS started_ms,
    min(CASE WHEN event IN ('succeeded', 'cancelled', 'timed_out', 'failed', 'abandoned',
                            'dead_lettered', 'skipped') THEN ts_ms END) AS ended_ms,
    max(duration_ms) AS duration_ms,
    coalesce(max(CASE WHEN event = 'started' THEN worker END),
             max(CASE WHEN event IN ('succeeded', 'cancelled', 'timed_out', 'failed',
                                     'abandoned') THEN worker END)) AS worker,
    coalesce(max(CASE WHEN event = 'started' THEN fence END),
             max(CASE WHEN started_ms IS NOT NULL THEN fence END)) AS fence,
    coalesce(max(CASE WHEN event IN ('timed_out', 'failed') THEN error END),
             max(CASE WHEN event IN ('abandoned', 'cancelled') THEN error END),
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
