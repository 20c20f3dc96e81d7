--[[ expire: a worker about to run the first attempt of a job with a start deadline
(startDeadlineSeconds, one-off jobs) asks here, under Redis's clock, whether it is too late:
a run dispatched in time can wait past its deadline in a queue stream or for a free slot.  Too
late, it is dead-lettered with the error 'missed start deadline' and its entry acknowledged:
never run late.  Only a run still 'dispatched' under this very entry (missed_start in include
deadline says which: its first attempt, dispatched by the deadline; a replay or trigger
dispatched after it is a deliberate run).  start.lua applies the same rule to an entry
reclaimed before its start was recorded.

KEYS[1] rsched:{pN}:run:<run id> HASH (the job key again for a one-off job's own run)
KEYS[2] rsched:{pN}:job:<id> HASH   KEYS[3] rsched:{pN}:q:<queue> STREAM
KEYS[4] rsched:{pN}:dead ZSET       KEYS[5] rsched:{pN}:events STREAM   KEYS[6] rsched:{pN}:stats HASH
ARGV[1] run id   ARGV[2] stream entry id   ARGV[3] now_ms (0 = Redis TIME)
ARGV[4] events_maxlen (0 = unbounded)      ARGV[5] consumer group
Returns 1: dead-lettered (do not run it), 0: run it
A run dead-lettered here frees its limit slot (job field 'lk'; include limits builds the
limit keys, and the partition's retry set rsched:{pN}:retry ZSET, from the partition's prefix,
and may PUBLISH on the wake channel).
]]
--!include layout
--!include util
--!include life
--!include streak
--!include dead_letter
--!include deadline
--!include limits
local run_key, job_key, stream_key, dead_key, events_key, stats_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local run_id, sid, now = ARGV[1], ARGV[2], now_ms(ARGV[3])
local maxlen, group = tonumber(ARGV[4]), ARGV[5]
local F = run_fields(run_key, job_key)
local r = redis.call('HMGET', run_key, F.state, F.attempt, F.stream_id, F.dispatched_ms)
local j = redis.call('HMGET', job_key, J.spec, J.type, J.limit_key)
if r[1] ~= 'dispatched' or r[3] ~= sid or not missed_start(j[1], run_id, r[2], r[4], now) then
  return 0
end
dead_letter(run_key, job_key, F, dead_key, events_key, stats_key, maxlen, now, run_id,
            string.match(run_id, '^(.*)@%d+$'), '1', 'missed start deadline', j[2])
if j[3] then
  local prefix = lim_prefix(events_key)
  lim_drop(prefix, j[3], run_id, lim_key(prefix, nil, 'retry'), now)
  lim_index(prefix)
end
redis.call('XACK', stream_key, group, sid)
return 1
