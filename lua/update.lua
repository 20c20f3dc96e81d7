--[[ update: change a scheduled or paused job's schedule, payload or settings (PATCH /jobs/{id}).

Python reads the job, validates the merged spec like a new one and computes the changed hash
fields and, when the schedule changed, the next occurrence (a cron job's from now).  This script
applies them only if the job is still as it was read (compare-and-set on status and next_ms),
so a dispatcher that advanced the job in between is never overwritten with stale times.
Applying the same call twice is harmless: the second finds every field already set, returns 0.
A paused job keeps out of the due set (resume computes its next run); a scheduled one moves.

KEYS[1] rsched:{pN}:job:<id> HASH   KEYS[2] rsched:{pN}:due ZSET   KEYS[3] rsched:{pN}:events STREAM
ARGV[1] job id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen (0 = unbounded)
ARGV[4] expected status (as read)   ARGV[5] expected next_ms (as read, '0' = none)
ARGV[6] new next_ms ('' = schedule unchanged, '0' = no next occurrence)
ARGV[7] new due score (ms, jitter applied; used with ARGV[6])
ARGV[8] expected version (If-Match; '' = any): a change increments the job's 'version'
ARGV[9] nfields, then nfields field/value pairs to set on the job hash
Returns {code, status}
  1 updated   0 already as requested (a repeated call; nothing written)   -1 no such job
  -2 not updatable (status says why: cancelled, completed, dead)
  -3 changed since it was read (the caller reads again and retries)
  -4 the job's version is not the expected one (checked first; nothing written)
]]
--!include layout
--!include util
local job_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local job_id, now, maxlen = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3])
local want_status, want_next, new_next, new_score = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local want_version, nf = ARGV[8], tonumber(ARGV[9])

local j = redis.call('HMGET', job_key, J.status, J.next_ms, J.type, 'version')
if j[3] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
if not j[1] then return {-1, ''} end
-- If-Match: the caller's version ('' = any) against the job's (absent = 1, a job never changed)
local version = tonumber(j[4] or '1')
if want_version ~= '' and tostring(version) ~= want_version then return {-4, j[1]} end
if j[1] ~= 'scheduled' and j[1] ~= 'paused' then return {-2, j[1]} end
local cur_next = j[2] or '0'

local same = (new_next == '' or cur_next == new_next)
for i = 0, nf - 1 do
  if not same then break end
  same = redis.call('HGET', job_key, ARGV[10 + 2 * i]) == ARGV[11 + 2 * i]
end
if same then return {0, j[1]} end
if j[1] ~= want_status or cur_next ~= want_next then return {-3, j[1]} end

if nf > 0 then redis.call('HSET', job_key, unpack(ARGV, 10, 9 + 2 * nf)) end
redis.call('HSET', job_key, J.updated_ms, now, 'version', version + 1)
if new_next ~= '' then
  redis.call('HSET', job_key, J.next_ms, new_next)
  if j[1] == 'scheduled' then
    if new_next ~= '0' then
      redis.call('ZADD', due_key, new_score, job_id)
    else
      redis.call('ZREM', due_key, job_id)
    end
  end
end
emit(events_key, maxlen, 'e', 'updated', 'j', job_id, 't', now, 'ty', j[3])
return {1, j[1]}
