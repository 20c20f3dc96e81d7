-- An outcome event (succeeded, failed, timed_out) whose run started and finished within one
-- worker report has no 'started' event of its own: it carries the start time here (stream field
-- 'st') and the start's fence in `fence`.
ALTER TABLE events ADD COLUMN started_ms bigint;
