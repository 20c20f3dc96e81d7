-- jobs: the job index, one row per job Redis holds, as of the latest event of it the archiver
-- applied (see rsched/archive/job_index.py).  The archiver reads each job a batch names from Redis
-- and upserts its row in the batch's transaction, unless the row holds a later event already
-- ((sid_ms, sid_seq): events of one job share a partition, so their ids are ordered): a batch
-- delivered twice changes nothing.  A job Redis no longer holds is deleted.  Filtered job
-- listings page through it by keyset (sort key, job_id) and read the listed jobs from Redis.
-- next_ms holds 9223372036854775807 for a job with no next run (it sorts last), last_run_ms 0
-- for a job that never ran (last newest first); last_run_status is NULL then.
-- Text compared by code point (COLLATE "C"): a prefix is one range of an index.
CREATE TABLE jobs (
    job_id          text COLLATE "C" NOT NULL PRIMARY KEY,
    part            smallint NOT NULL,
    job_type        text COLLATE "C" NOT NULL,
    queue           text COLLATE "C" NOT NULL,
    status          text NOT NULL,
    next_ms         bigint NOT NULL,
    created_ms      bigint NOT NULL,
    updated_ms      bigint NOT NULL,
    last_run_status text,
    last_run_ms     bigint NOT NULL,
    idem_key        text COLLATE "C",
    sid_ms          bigint NOT NULL,
    sid_seq         bigint NOT NULL
);

-- Listings: one index per sort (next run, creation, last run), and one per filter in creation
-- order that also holds the other two sort keys.  A page of a filter sorted by next or last run
-- reads its filter's index alone and sorts the matches while they are few, or walks the sort's
-- index skipping rows that do not match when they are many (Store._plan counts them).  Each
-- index is one more write per changed row, which the archiver pays for every job it reads.
-- Prefix search (?q=) reads ranges of job_id (the primary key), job_type (its index's first
-- column) and idem_key.
CREATE INDEX jobs_next ON jobs (next_ms, job_id);
CREATE INDEX jobs_created ON jobs (created_ms, job_id);
CREATE INDEX jobs_last ON jobs (last_run_ms, job_id);
CREATE INDEX jobs_type ON jobs (job_type, created_ms, job_id) INCLUDE (next_ms, last_run_ms);
CREATE INDEX jobs_queue ON jobs (queue, created_ms, job_id) INCLUDE (next_ms, last_run_ms);
CREATE INDEX jobs_status ON jobs (status, created_ms, job_id) INCLUDE (next_ms, last_run_ms);
CREATE INDEX jobs_lastrun ON jobs (last_run_status, created_ms, job_id) INCLUDE (next_ms, last_run_ms);
CREATE INDEX jobs_idem ON jobs (idem_key) WHERE idem_key IS NOT NULL;

-- What the archiver's housekeeping of the index knows: 'scanned_ms', when a scan of every job
-- key in Redis last filled in the jobs no event had named (job_index.IndexScan).
CREATE TABLE job_index_meta (
    name  text   NOT NULL PRIMARY KEY,
    value bigint NOT NULL
);
