-- A recurring job's occurrence was dead-lettered: one more in the job's failure streak (field
-- 'fails'; a success resets it, complete.lua, and so does a resume).  With pauseAfterFailures
-- N (spec_life in include life) the Nth in a row pauses a scheduled job (by 'pauseAfterFailures'), with the
-- reason (fields paused_ms, paused_by, paused_note, paused_reason: models.Control).  Returns the
-- reason when it paused the job, else nil.  A one-off job has no streak.
local function fail_streak(job_key, now, run_id)
  local j = redis.call('HMGET', job_key, J.status, J.cron, J.spec, 'version')
  if not j[2] or j[2] == '' then return nil end
  local fails = redis.call('HINCRBY', job_key, 'fails', 1)
  local life = spec_life(j[3])
  local limit = life and life[5] or 0
  if limit == 0 or fails < limit or (j[1] or DEFAULT_STATUS) ~= 'scheduled' then return nil end
  local why = string.format('%d', fails) .. ' consecutive occurrences dead-lettered (the last: '
    .. run_id .. ')'
  redis.call('HSET', job_key, J.status, 'paused', J.updated_ms, now,
             'version', tonumber(j[4] or '1') + 1, 'paused_ms', now, 'paused_by', 'pauseAfterFailures',
             'paused_note', '', 'paused_reason', why)
  return why
end
