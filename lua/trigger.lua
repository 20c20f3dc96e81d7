--[[ trigger: run a job once now, outside its schedule (its regular occurrences do not move).

KEYS[1] rsched:{pN}:job:<id> HASH   KEYS[2] rsched:{pN}:run:<run id> HASH
KEYS[3] rsched:{pN}:retry ZSET      KEYS[4] rsched:{pN}:events STREAM
ARGV[1] job id   ARGV[2] run id (<job id>@<sched ms>)   ARGV[3] sched_ms   ARGV[4] now_ms (0 = TIME)
ARGV[5] events_maxlen
Returns {code, status}: 1 triggered, 0 that run already exists, -1 no such job, -2 job finished
]]
--!include layout
--!include util
local job_key, run_key, retry_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job_id, run_id, sched = ARGV[1], ARGV[2], ARGV[3]
local now, maxlen = now_ms(ARGV[4]), tonumber(ARGV[5])
local j = redis.call('HMGET', job_key, J.status, J.type, J.queue, J.own_run)
if j[2] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
if not j[1] then return {-1, ''} end
if j[1] == 'cancelled' then return {-2, j[1]} end
if j[4] == run_id or redis.call('EXISTS', run_key) == 1 then return {0, j[1]} end
-- The run id holds the job id and the scheduled time; no field repeats them.
redis.call('HSET', run_key, 'attempt', 0, 'state', 'retry_wait', 'fence', 0, 'worker', '',
           'queue', j[3] or DEFAULT_QUEUE, 'type', j[2])
redis.call('ZADD', retry_key, now, run_id)
redis.call('HSET', job_key, J.last_run_id, run_id)
if j[1] == 'completed' or j[1] == 'dead' then
  redis.call('HSET', job_key, J.status, 'scheduled', J.updated_ms, now)
end
emit(events_key, maxlen, 'e', 'triggered', 'j', job_id, 'r', run_id, 't', now, 'ty', j[2])
return {1, j[1]}
