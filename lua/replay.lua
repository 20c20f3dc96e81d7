--[[ replay: send a dead-lettered run back for another round of attempts, counted from zero.

KEYS[1] rsched:{pN}:run:<run id> HASH (untouched when the run is the job's own: its fields
        are in the job hash, see run_fields in util)   KEYS[2] rsched:{pN}:job:<id> HASH
KEYS[3] rsched:{pN}:dead ZSET   KEYS[4] rsched:{pN}:retry ZSET   KEYS[5] rsched:{pN}:events STREAM
ARGV[1] run id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
Returns {code, state}: 1 replayed, 0 already replayed (not dead any more), -1 no such dead letter,
  -2 the job was cancelled (cancel is final)
]]
--!include layout
--!include util
local run_key, job_key, dead_key, retry_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local run_id, now, maxlen = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3])
local job_id = string.match(run_id, '^(.*)@%d+$')  -- the job id, from the run id
local j = redis.call('HMGET', job_key, J.status, J.own_run, OWN.state, J.type)
if j[4] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
local rkey, F = run_home(run_id, run_key, job_key, j[2])
local state, jtype = j[3], j[4]
if F == PLAIN_RUN then
  local r = redis.call('HMGET', run_key, 'state', 'type')
  state, jtype = r[1], r[2]
end
if not state then return {-1, ''} end
if state ~= 'dead' then return {0, state} end
local status = j[1]
if status == 'cancelled' or not status then return {-2, status or 'missing'} end
redis.call('ZREM', dead_key, run_id)
redis.call('HSET', rkey, F.state, 'retry_wait', F.attempt, 0, F.error, '')
redis.call('ZADD', retry_key, now, run_id)
if status == 'dead' then redis.call('HSET', job_key, J.status, 'scheduled', J.updated_ms, now) end
emit(events_key, maxlen, 'e', 'replayed', 'j', job_id, 'r', run_id, 't', now, 'ty', jtype)
return {1, 'retry_wait'}
