-- jobs: the job index, one row per job Redis holds, as of the latest event of it the archiver
-- applied (see rsched/archive/job_index.py).  The archiver reads each job a batch names from Redis
-- and upserts its row in the batch's transaction, unless the row holds a later event already
-- ((sid_ms, sid_seq): events of one job share a partition, so their ids are ordered): a batch
-- delivered twice changes nothing.  A job Redis no longer holds is deleted.  Filtered job
-- listings page through it by keyset (sort key, job_id) and read the listed jobs from Redis.
-- next_ms holds 9223372036854775807 for a job with no next run (it sorts last), last_run_ms 0
-- for a job that never ran (last newest first); last_run_status is NULL then.
CREATE TABLE jobs (
    job_id          TEXT NOT NULL PRIMARY KEY,
    part            INTEGER NOT NULL,
    job_type        TEXT NOT NULL,
    queue           TEXT NOT NULL,
    status          TEXT NOT NULL,
    next_ms         INTEGER NOT NULL,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    last_run_status TEXT,
    last_run_ms     INTEGER NOT NULL,
    idem_key        TEXT,
    sid_ms          INTEGER NOT NULL,
    sid_seq         INTEGER NOT NULL
);

-- Listings sorted by next run, creation or last run, unfiltered or by one filter: a page is
-- one range of one index.  Prefix search (?q=) reads job_id (the primary key), job_type
-- (the type indexes' first column) and idem_key.
CREATE INDEX jobs_next ON jobs (next_ms, job_id);
CREATE INDEX jobs_created ON jobs (created_ms, job_id);
CREATE INDEX jobs_last ON jobs (last_run_ms, job_id);
CREATE INDEX jobs_type_next ON jobs (job_type, next_ms, job_id);
CREATE INDEX jobs_type_created ON jobs (job_type, created_ms, job_id);
CREATE INDEX jobs_type_last ON jobs (job_type, last_run_ms, job_id);
CREATE INDEX jobs_queue_next ON jobs (queue, next_ms, job_id);
CREATE INDEX jobs_queue_created ON jobs (queue, created_ms, job_id);
CREATE INDEX jobs_queue_last ON jobs (queue, last_run_ms, job_id);
CREATE INDEX jobs_status_next ON jobs (status, next_ms, job_id);
CREATE INDEX jobs_status_created ON jobs (status, created_ms, job_id);
CREATE INDEX jobs_status_last ON jobs (status, last_run_ms, job_id);
CREATE INDEX jobs_lastrun_next ON jobs (last_run_status, next_ms, job_id);
CREATE INDEX jobs_lastrun_created ON jobs (last_run_status, created_ms, job_id);
CREATE INDEX jobs_lastrun_last ON jobs (last_run_status, last_run_ms, job_id);
CREATE INDEX jobs_idem ON jobs (idem_key);
