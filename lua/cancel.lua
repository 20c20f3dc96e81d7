--[[ cancel: end a job for good; a run in progress finishes, pending retries are abandoned.  A
cancelled one-off job expires after ARGV[5], as a completed one does (complete.lua); a recurring
job stays (its history list and runs are keys of their own).

KEYS[1] rsched:{pN}:job:<id> HASH   KEYS[2] rsched:{pN}:due ZSET   KEYS[3] rsched:{pN}:events STREAM
ARGV[1] job id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] expected version (If-Match; '' = any): a change increments the job's 'version'
ARGV[5] finished_ttl_ms: how long a cancelled one-off job is kept (0 = forever)
Returns {code, status}: 1 cancelled, 0 already cancelled, -1 no such job, -2 already finished,
  -4 the job's version is not the expected one (nothing written)
]]
--!include layout
--!include util
local job_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local job_id, now, maxlen = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3])
local want_version, finished_ttl = ARGV[4], tonumber(ARGV[5])
local j = redis.call('HMGET', job_key, J.status, J.type, 'version', J.cron)
if j[2] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
if not j[1] then return {-1, ''} end
-- If-Match: the caller's version ('' = any) against the job's (absent = 1, a job never changed)
local version = tonumber(j[3] or '1')
if want_version ~= '' and tostring(version) ~= want_version then return {-4, j[1]} end
if j[1] == 'cancelled' then return {0, 'cancelled'} end
if j[1] ~= 'scheduled' and j[1] ~= 'paused' then return {-2, j[1]} end
-- next_ms stays: a one-off job's runAt is read from it (core.models.Job.from_hash), and no
-- script reads a cancelled job's.
redis.call('HSET', job_key, J.status, 'cancelled', J.updated_ms, now, 'version', version + 1)
redis.call('ZREM', due_key, job_id)
if finished_ttl > 0 and (not j[4] or j[4] == '') then redis.call('PEXPIRE', job_key, ARGV[5]) end
emit(events_key, maxlen, 'e', 'cancelled', 'j', job_id, 't', now, 'ty', j[2])
return {1, 'cancelled'}
