-- One row per entry of a partition's Redis events stream (see rsched/archive/events.py).
-- Identity: the stream entry id (sid_ms-sid_seq) within partition `part`; redelivered entries
-- hit the primary key and are skipped (INSERT ... ON CONFLICT DO NOTHING).
-- Partitioned by day of sid_ms (the time Redis appended the entry): retention drops whole days.
-- The archiver creates day partitions (events_dYYYYMMDD) before it inserts into them.
CREATE TABLE events (
    sid_ms      bigint   NOT NULL,
    sid_seq     bigint   NOT NULL,
    part        smallint NOT NULL,
    event       text     NOT NULL,
    job_id      text,
    run_id      text,
    attempt     bigint,
    ts_ms       bigint,
    worker      text,
    duration_ms bigint,
    job_type    text,
    queue       text,
    sched_ms    bigint,
    error       text,
    result      text,
    fence       bigint,
    retry_at_ms bigint,
    extra       text,
    PRIMARY KEY (sid_ms, sid_seq, part)
) PARTITION BY RANGE (sid_ms);

-- Runs of job X, newest first: the latest run times of a job, then all events of those runs.
CREATE INDEX events_job_sched ON events (job_id, sched_ms);
-- Failures and durations of a type in a time range.
CREATE INDEX events_type_ts ON events (job_type, ts_ms);
-- Any time range: events arrive in time order, so a block range index stays tiny.
CREATE INDEX events_ts ON events USING brin (ts_ms);
