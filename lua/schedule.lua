--[[ schedule: create jobs of one partition; each job atomically, idempotent on its id.

The jobs of a call store the same hash fields, so their names travel once per call; the values
the jobs of a batch mostly share (type, queue, status, ...) travel once per group of jobs that
share them, and each job carries only its own: a third of the arguments a job once took, for
Redis to parse and the client to pack.

KEYS[1]     rsched:{pN}:due           ZSET   job id -> due score
KEYS[2]     rsched:{pN}:events        STREAM history
KEYS[3]     rsched:{pN}:queues        SET    queue names in use
KEYS[3+i]   rsched:{pN}:job:<id_i>    HASH   one per job, in ARGV order
ARGV[1]     now_ms (0 = Redis TIME)
ARGV[2]     events_maxlen (0 = unbounded)
ARGV[3]     n, the number of jobs
ARGV[4]     ns, the number of shared job-hash fields; the first two are type and queue
ARGV[5]     no, the number of a job's own job-hash fields; the first is id
ARGV[6..5+ns+no]  the shared field names, then the own field names
then groups until n jobs are read; a group: count, its ns shared values, then count jobs, each:
  body_hash ('' = none: a job with a random id, which only a replay of this very call can find
  existing), score (due score; '' = not indexed, e.g. created paused), its no own values
Stores per job: the ns + no fields, created_ms, and body_hash unless ''.  The call's 'scheduled'
events share one events-stream entry (batch_flush in util).
Returns {head, now_ms, code_1, ..., code_n}
  head    1 if a job created here is now the partition's earliest due job (wake a dispatcher)
  now_ms  the time the script stamped on created jobs
  code_i  0 created, 1 already exists with the same body_hash (idempotent replay),
          2 exists with another body_hash (conflict)
]]
--!include util
local due_key, events_key, queues_key = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms(ARGV[1])
local maxlen = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local ns, no = tonumber(ARGV[4]), tonumber(ARGV[5])
-- The time as a string once: Redis formats a Lua number argument with snprintf on every call,
-- twice a job here (created_ms, the event's t).
local now_s = string.format('%d', now)
-- HSET arguments, reused for every job: names fixed, values refilled.
local fields = {'created_ms', now_s}
for k = 1, ns + no do fields[1 + 2 * k] = ARGV[5 + k] end
local out = {0, now}
local earliest = nil
-- One ZADD for the call's jobs (a call per job cost ~1 us each), flushed below Lua's
-- unpack limit.
local due = {}
local function flush_due()
  if #due > 0 then redis.call('ZADD', due_key, unpack(due)) end
  due = {}
end
-- The call's 'scheduled' events share one events-stream entry (batch_new in util).
local scheduled = batch_new(events_key, maxlen, {'e', 'scheduled', 't', now_s}, {'j', 'ty', 'q'})
local a = 6 + ns + no
local i = 0
while i < n do
  local count = tonumber(ARGV[a])
  local jtype, queue = ARGV[a + 1], ARGV[a + 2]
  for k = 1, ns do fields[2 + 2 * k] = ARGV[a + k] end
  a = a + 1 + ns
  redis.call('SADD', queues_key, queue)
  for _ = 1, count do
    i = i + 1
    local body_hash, score, id = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    for k = 1, no do fields[2 + 2 * (ns + k)] = ARGV[a + 1 + k] end
    a = a + 2 + no
    local job_key = KEYS[3 + i]
    local existing
    if body_hash == '' then
      existing = redis.call('EXISTS', job_key) == 1 and ''
    else
      existing = redis.call('HGET', job_key, 'body_hash')
    end
    if existing then
      out[i + 2] = (existing == body_hash) and 1 or 2
    else
      if body_hash == '' then
        redis.call('HSET', job_key, unpack(fields))
      else
        redis.call('HSET', job_key, 'body_hash', body_hash, unpack(fields))
      end
      if score ~= '' then
        due[#due + 1] = score
        due[#due + 1] = id
        if #due >= 2000 then flush_due() end
        local s = tonumber(score)
        if not earliest or s < earliest then earliest = s end
      end
      local k = batch_slot(scheduled)
      scheduled[1][k], scheduled[2][k], scheduled[3][k] = id, jtype, queue
      out[i + 2] = 0
    end
  end
end
flush_due()
batch_flush(scheduled)
if earliest then
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) >= earliest then out[1] = 1 end
end
return out
