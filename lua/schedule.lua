--[[ schedule: create jobs of one partition; each job atomically, idempotent on its id.

KEYS[1]     rsched:{pN}:due           ZSET   job id -> due ms
KEYS[2]     rsched:{pN}:events        STREAM history
KEYS[3]     rsched:{pN}:queues        SET    queue names in use
KEYS[3+i]   rsched:{pN}:job:<id_i>    HASH   one per job, in ARGV order
ARGV[1]     now_ms (0 = Redis TIME)
ARGV[2]     events_maxlen (0 = unbounded)
ARGV[3]     n, the number of jobs
then per job: id, queue, type, body_hash, score (due ms; '' = not indexed, e.g. created paused),
              nfields, then nfields field/value pairs of the job hash
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
local out = {0, now}
local earliest = nil
local seen_queues = {}
local a = 4
for i = 1, n do
  local id, queue, jtype, body_hash, score = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local nf = tonumber(ARGV[a + 5])
  local job_key = KEYS[3 + i]
  local first = a + 6
  a = first + 2 * nf
  local existing = redis.call('HGET', job_key, 'body_hash')
  if existing then
    out[i + 2] = (existing == body_hash) and 1 or 2
  else
    redis.call('HSET', job_key, 'body_hash', body_hash, 'created_ms', now, 'updated_ms', now,
               unpack(ARGV, first, a - 1))
    if score ~= '' then
      redis.call('ZADD', due_key, score, id)
      local s = tonumber(score)
      if not earliest or s < earliest then earliest = s end
    end
    if not seen_queues[queue] then
      redis.call('SADD', queues_key, queue)
      seen_queues[queue] = true
    end
    emit(events_key, maxlen, 'e', 'scheduled', 'j', id, 't', now, 'ty', jtype, 'q', queue)
    out[i + 2] = 0
  end
end
if earliest then
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) >= earliest then out[1] = 1 end
end
return out
