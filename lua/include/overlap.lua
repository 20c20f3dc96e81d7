-- Why a run asked to stop by overlap cancelPrevious ended without running (again).
local STOPPED = 'cancelled: overlap cancelPrevious, a later occurrence replaces it'

-- A run dispatched under overlap skip, bufferOne or cancelPrevious, or by a bufferAll backfill
-- (field 'ov' in its hash) has ended: the job's active-run record lets go of it (and of a request
-- to stop it, job field 'cancel'), and the next run waiting becomes the active run, due now
-- through the retry set (claim.lua dispatches a 'buffered' run as its attempt 1): the job's
-- buffered occurrence first (job field 'buffered'), else the next of a bufferAll backfill's runs
-- (job field 'bq', the first of them not started: each such run's hash names the one after it
-- as 'bnext', so the backfill's occurrences run one after another).
-- run_key: the ended run's hash (its 'bnext' is read), as its caller was given it.
local function release_active(job_key, retry_key, run_id, now, run_key)
  local a = redis.call('HMGET', job_key, 'active', 'buffered', 'bq')
  if a[1] ~= run_id then return end
  redis.call('HDEL', job_key, 'cancel')
  local queued = a[3] or ''
  local nxt = run_key and redis.call('HGET', run_key, 'bnext')
  if nxt and nxt ~= '' then queued = nxt end  -- its backfill's next occurrence waits behind it
  if a[2] and a[2] ~= '' then
    redis.call('HSET', job_key, 'active', a[2], 'buffered', '')
    redis.call('ZADD', retry_key, now, a[2])
    if queued ~= '' then redis.call('HSET', job_key, 'bq', queued) end
  elseif queued ~= '' then
    redis.call('HSET', job_key, 'active', queued)
    redis.call('HDEL', job_key, 'bq')
    redis.call('ZADD', retry_key, now, queued)
  else
    redis.call('HDEL', job_key, 'active')
  end
end

-- run_id becomes the job's one buffered run behind its active run; under cancelPrevious
-- (policy 'c') the active run is asked to stop (job field 'cancel'; one waiting for a retry is
-- due at once: claim.lua then records it cancelled).
local function buffer_behind(job_key, retry_key, run_id, active, policy, now)
  redis.call('HSET', job_key, 'buffered', run_id)
  if policy == 'c' then
    redis.call('HSET', job_key, 'cancel', active)
    redis.call('ZADD', retry_key, 'XX', now, active)
  end
end
