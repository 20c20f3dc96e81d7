-- One row per entry of a partition's Redis events stream (see rsched/archive/events.py).
-- Identity: the stream entry id (sid_ms-sid_seq) within partition `part`; redelivered entries
-- hit the primary key and are skipped (INSERT ... ON CONFLICT DO NOTHING).
-- Retention deletes a range of the primary key (sid_ms first), so it needs no extra index.
CREATE TABLE events (
    sid_ms      INTEGER NOT NULL,
    sid_seq     INTEGER NOT NULL,
    part        INTEGER NOT NULL,
    event       TEXT    NOT NULL,
    job_id      TEXT,
    run_id      TEXT,
    attempt     INTEGER,
    ts_ms       INTEGER,
    worker      TEXT,
    duration_ms INTEGER,
    job_type    TEXT,
    queue       TEXT,
    sched_ms    INTEGER,
    error       TEXT,
    result      TEXT,
    fence       INTEGER,
    retry_at_ms INTEGER,
    extra       TEXT,
    PRIMARY KEY (sid_ms, sid_seq, part)
);

-- Runs of job X, newest first: the latest run times of a job, then all events of those runs.
CREATE INDEX events_job_sched ON events (job_id, sched_ms);
-- Failures and durations of a type in a time range.
CREATE INDEX events_type_ts ON events (job_type, ts_ms);
-- Any time range.
CREATE INDEX events_ts ON events (ts_ms);
