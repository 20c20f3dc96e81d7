--[[ replay: send a dead-lettered run back for another round of attempts, counted from zero.

KEYS[1] rsched:{pN}:run:<run id> HASH (untouched when the run is the job's own: its fields
        are in the job hash, see run_fields in util)   KEYS[2] rsched:{pN}:job:<id> HASH
KEYS[3] rsched:{pN}:dead ZSET   KEYS[4] rsched:{pN}:retry ZSET   KEYS[5] rsched:{pN}:events STREAM
ARGV[1] run id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] overlap: '' allow, 's' skip, 'b' bufferOne, 'c' cancelPrevious (the job's policy, read by
        the caller): decided as claim.lua decides an occurrence, against the job's active run.
        With no active run the replayed run becomes it (field 'ov' '1', job field 'active'),
        due now through the retry set; else under bufferOne or cancelPrevious it becomes the
        job's buffered run (state 'buffered': release_active in include overlap sends it when
        the active run ends; cancelPrevious asks the active run to stop, see claim.lua) unless
        one waits already; under skip, or with a buffered run waiting, it is refused (-5) and
        stays a dead letter, to be replayed once the active run has ended.
Returns {code, state}: 1 replayed (state 'retry_wait', or 'buffered'), 0 already replayed (not
  dead any more), -1 no such dead letter, -2 the job was cancelled (cancel is final), -5 held by
  the overlap policy (state: why, naming the active run)
]]
--!include layout
--!include util
--!include overlap
local run_key, job_key, dead_key, retry_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local run_id, now, maxlen, overlap = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local job_id = string.match(run_id, '^(.*)@%d+$')  -- the job id, from the run id
local j = redis.call('HMGET', job_key, J.status, J.own_run, OWN.state, J.type, 'active',
                     'buffered')
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
local active, buffered = j[5] or '', j[6] or ''
if active == run_id then active = '' end  -- a record its dead-lettering left behind
local next_state = 'retry_wait'
if overlap ~= '' and active ~= '' then
  if overlap == 's' or buffered ~= '' then
    local why = 'overlap: run ' .. active .. ' of this job is still active'
    if buffered ~= '' then why = why .. ' and ' .. buffered .. ' waits already' end
    return {-5, why}
  end
  next_state = 'buffered'
end
redis.call('ZREM', dead_key, run_id)
redis.call('HSET', rkey, F.state, next_state, F.attempt, 0, F.error, '')
if next_state == 'buffered' then
  redis.call('HSET', rkey, 'ov', '1')
  buffer_behind(job_key, retry_key, run_id, active, overlap, now)
else
  if overlap ~= '' then
    redis.call('HSET', rkey, 'ov', '1')
    redis.call('HSET', job_key, 'active', run_id)
  end
  redis.call('ZADD', retry_key, now, run_id)
end
if status == 'dead' then redis.call('HSET', job_key, J.status, 'scheduled', J.updated_ms, now) end
emit(events_key, maxlen, 'e', 'replayed', 'j', job_id, 'r', run_id, 't', now, 'ty', jtype)
return {1, next_state}
