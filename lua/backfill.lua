--[[ backfill: run occurrences of a recurring job's schedule that lie in the past, each once, with
its nominal time (the run id <job id>@<nominal ms>), under the job's overlap policy.

An occurrence whose run hash exists already ran (or was buffered, queued or dead-lettered: by the
dispatcher, a trigger or an earlier backfill) and is left alone; one recorded 'skipped' by an
overlap policy never ran and may run now.  claim.lua checks the same run hash, so an occurrence a
backfill ran is not dispatched again when the dispatcher reaches it.  Runs go through the retry
set as attempt 0 (claim.lua dispatches them as attempt 1), as trigger.lua's do.  Safe to apply
twice: the second call finds every run hash.

KEYS[1] rsched:{pN}:job:<id> HASH   KEYS[2] rsched:{pN}:retry ZSET
KEYS[3] rsched:{pN}:events STREAM
KEYS[3+i] rsched:{pN}:run:<job id>@<sched_ms_i> HASH, i = 1..n
ARGV[1] job id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] run_ttl_ms: how long the hash of a run skipped by the overlap policy is kept (0 = ever)
ARGV[5] overlap: '' allow, 's' skip, 'b' bufferOne, 'c' cancelPrevious (the job's policy, read
        by the caller; a job's overlap never changes): decided as claim.lua does, against the
        job's active run
ARGV[6] dry: '' a backfill; else a dry run, which decides each occurrence as below and writes
        nothing (the codes say what a backfill would do now): '=' starts from the job's active
        and buffered runs, '<active>|<buffered>' from those (either may be empty), which the
        previous chunk's dry call returned (a chunk's decisions depend on the runs the
        previous chunk's would have made active or buffered)
ARGV[7] n   then ARGV[7+i] sched_ms_i
Returns {code, status, c_1, ..., c_n}: code 1 done, -1 no such job, -2 job cancelled (status
  says so; nothing written); c_i: 1 queued, 0 a run of it exists already, 2 skipped by the overlap
  policy (recorded as a 'skipped' run), 3 buffered (overlap bufferOne: starts when the active
  run ends).  A dry run's reply ends with the active and buffered run ids its decisions leave
  ('' for none), for its next chunk.
The call's 'triggered' and 'skipped' events share one events-stream entry each (batch_flush).
]]
--!include layout
--!include util
--!include overlap
local job_key, retry_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local job_id, now, maxlen = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3])
local now_s = string.format('%d', now)
local run_ttl, overlap, dry, n = ARGV[4], ARGV[5], ARGV[6] ~= '', tonumber(ARGV[7])
local j = redis.call('HMGET', job_key, J.status, J.type, J.queue, 'version', 'active',
                     'buffered')
if j[2] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
if not j[1] then return {-1, ''} end
if j[1] == 'cancelled' then return {-2, j[1]} end
local jtype, queue, version, active, buffered = j[2], j[3] or DEFAULT_QUEUE, j[4] or '1', j[5] or '', j[6] or ''
if dry and ARGV[6] ~= '=' then active, buffered = string.match(ARGV[6], '^(.-)|(.*)$') end
local queued = batch_new(events_key, maxlen, {'e', 'triggered', 'j', job_id, 't', now_s,
                                              'ty', jtype}, {'r'})
local skips = batch_new(events_key, maxlen, {'e', 'skipped', 'j', job_id, 't', now_s,
                                             'ty', jtype, 'q', queue}, {'r', 's', 'err'})
local out = {1, j[1]}
local last = nil
for i = 1, n do
  local sched = ARGV[7 + i]
  local run_id, run_key = job_id .. '@' .. sched, KEYS[3 + i]
  local state = redis.call('HGET', run_key, 'state')
  local code = 0
  if state and state ~= 'skipped' then
    code = 0
  elseif overlap == '' or active == '' then
    if overlap ~= '' then active = run_id end
    if not dry then
      redis.call('DEL', run_key)  -- a skipped record's ended_ms and error go
      redis.call('HSET', run_key, 'attempt', '0', 'state', 'retry_wait', 'fence', '0',
                 'worker', '', 'queue', queue, 'type', jtype, 'v', version)
      if overlap ~= '' then
        redis.call('HSET', run_key, 'ov', '1')
        redis.call('HSET', job_key, 'active', run_id)
      end
      redis.call('ZADD', retry_key, now_s, run_id)
      queued[1][batch_slot(queued)] = run_id
      last = run_id
    end
    code = 1
  elseif overlap ~= 's' and buffered == '' then
    buffered = run_id
    if not dry then
      redis.call('DEL', run_key)
      redis.call('HSET', run_key, 'attempt', '0', 'state', 'buffered', 'queue', queue,
                 'type', jtype, 'ov', '1', 'v', version)
      buffer_behind(job_key, retry_key, run_id, active, overlap, now_s)
    end
    code = 3
  else
    if not dry then
      local why = 'overlap: run ' .. active .. ' of this job is still active'
      if overlap ~= 's' then why = why .. ' and ' .. buffered .. ' waits already' end
      redis.call('HSET', run_key, 'attempt', '0', 'state', 'skipped', 'queue', queue,
                 'type', jtype, 'ended_ms', now_s, 'error', why, 'v', version)
      if run_ttl ~= '0' then redis.call('PEXPIRE', run_key, run_ttl) end
      local k = batch_slot(skips)
      skips[1][k], skips[2][k], skips[3][k] = run_id, sched, why
    end
    code = 2
  end
  out[2 + i] = code
end
if dry then
  out[3 + n], out[4 + n] = active, buffered
  return out
end
if last then redis.call('HSET', job_key, J.last_run_id, last) end
batch_flush(queued)
batch_flush(skips)
return out
