--[[ resume: let a paused job run again from its next time computed from now.

KEYS[1] rsched:{pN}:job:<id> HASH   KEYS[2] rsched:{pN}:due ZSET   KEYS[3] rsched:{pN}:events STREAM
ARGV[1] job id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] next_ms (nominal next occurrence, '0' = none: a one-off that already ran)
ARGV[5] next_score (due ms with jitter)
ARGV[6] expected version (If-Match; '' = any): a change increments the job's 'version'
ARGV[7] who resumes   ARGV[8] their note ('' = none): resumed_by, resumed_note, resumed_ms
A resume ends the job's failure streak (include streak).  A recurring job with no occurrence
left (next_ms '0': past its endAt or its maxRuns) completes instead.
Returns {code, status}: 1 resumed, 0 already scheduled, -1 no such job, -2 not resumable,
  -4 the job's version is not the expected one (nothing written)
]]
--!include layout
--!include util
local job_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local job_id, now, maxlen = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3])
local next_ms, next_score = ARGV[4], ARGV[5]
local want_version = ARGV[6]
local j = redis.call('HMGET', job_key, J.status, J.type, 'version', J.cron)
if j[2] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
if not j[1] then return {-1, ''} end
-- If-Match: the caller's version ('' = any) against the job's (absent = 1, a job never changed)
local version = tonumber(j[3] or '1')
if want_version ~= '' and tostring(version) ~= want_version then return {-4, j[1]} end
if j[1] == 'scheduled' then return {0, 'scheduled'} end
if j[1] ~= 'paused' then return {-2, j[1]} end
local status = 'scheduled'
if next_ms == '0' and j[4] and j[4] ~= '' then status = 'completed' end
redis.call('HSET', job_key, J.status, status, J.updated_ms, now, J.next_ms, next_ms,
           'version', version + 1, 'resumed_ms', now, 'resumed_by', ARGV[7],
           'resumed_note', ARGV[8])
redis.call('HDEL', job_key, 'fails')
if next_ms ~= '0' then redis.call('ZADD', due_key, next_score, job_id) end
emit(events_key, maxlen, 'e', 'resumed', 'j', job_id, 't', now, 'ty', j[2])
return {1, status}
