-- Why a run asked to stop by overlap cancelPrevious ended without running (again).
local STOPPED = 'cancelled: overlap cancelPrevious, a later occurrence replaces it'

-- A run dispatched under overlap skip, bufferOne or cancelPrevious (field 'ov' in its hash) has
-- ended: the job's active-run record lets go of it (and of a request to stop it, job field
-- 'cancel'), and a buffered occurrence becomes the active run, due now through the retry set
-- (claim.lua dispatches a 'buffered' run as its attempt 1).
local function release_active(job_key, retry_key, run_id, now)
  local a = redis.call('HMGET', job_key, 'active', 'buffered')
  if a[1] ~= run_id then return end
  redis.call('HDEL', job_key, 'cancel')
  if a[2] and a[2] ~= '' then
    redis.call('HSET', job_key, 'active', a[2], 'buffered', '')
    redis.call('ZADD', retry_key, now, a[2])
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
