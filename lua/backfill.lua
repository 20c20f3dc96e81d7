--[[ backfill: run occurrences of a recurring job's schedule that lie in the past, each once, with
its nominal time (the run id <job id>@<nominal ms>), under the backfill's overlap policy.

An occurrence whose run hash exists already ran (or was buffered, queued or dead-lettered: by the
dispatcher, a trigger or an earlier backfill) and is left alone; one recorded 'skipped' by an
overlap policy never ran and may run now.  claim.lua checks the same run hash, so an occurrence a
backfill ran is not dispatched again when the dispatcher reaches it.  Runs go through the retry
set as attempt 0 (claim.lua dispatches them as attempt 1), as trigger.lua's do.  Safe to apply
twice: the second call finds every run hash.

KEYS[1] rsched:{pN}:job:<id> HASH   KEYS[2] rsched:{pN}:retry ZSET
KEYS[3] rsched:{pN}:events STREAM   KEYS[4] rsched:{pN}:hist:<id> LIST (skipped runs recorded)
KEYS[5] rsched:{pN}:run:<tail> HASH: the last run of the job's bufferAll backfills, ARGV[8]
        (unused when that is '')
KEYS[5+i] rsched:{pN}:run:<job id>@<sched_ms_i> HASH, i = 1..n
ARGV[1] job id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] run_ttl_ms: how long the hash of a run skipped by the overlap policy is kept (0 = ever)
ARGV[5] overlap (the backfill's): '' allow, 's' skip, 'b' bufferOne, 'c' cancelPrevious, decided
        as claim.lua does against the job's active run; 'a' bufferAll: the occurrences run one
        after another, the first at once unless the job has an active run, each later one
        'buffered' behind the one before it (the run before names it as 'bnext'; the job's
        'bq' names the first when it waits for a run of the job's own; release_active in
        include overlap starts each in turn), after the runs of an earlier bufferAll backfill
        still waiting (job field 'bq_tail', the last of them)
ARGV[6] dry: '' a backfill; else a dry run, which decides each occurrence as below and writes
        nothing (the codes say what a backfill would do now): '=' starts from the job's active
        and buffered runs, '<active>|<buffered>' from those (either may be empty), which the
        previous chunk's dry call returned (a chunk's decisions depend on the runs the
        previous chunk's would have made active or buffered)
ARGV[7] history_len: the job history list's bound (skipped runs are recorded in it)
ARGV[8] tail: the job's 'bq_tail' as the caller read it ('' none): bufferAll only
ARGV[9] n   then ARGV[9+i] sched_ms_i
Returns {code, status, c_1, ..., c_n}: code 1 done, -1 no such job, -2 job cancelled (status
  says so; nothing written), -3 (bufferAll) the job's 'bq_tail' is not ARGV[8]: status is the
  job's, nothing written, call again with it; c_i: 1 queued, 0 a run of it exists already,
  2 skipped by the overlap policy (recorded as a 'skipped' run, in the job's history too),
  3 buffered (overlap bufferOne: starts when the active run ends; bufferAll: when the run
  before it has).  A dry run's reply ends with the active and buffered run ids its decisions
  leave ('' for none), for its next chunk.
The call's 'triggered' and 'skipped' events share one events-stream entry each (batch_flush).
]]
--!include layout
--!include util
--!include overlap
local job_key, retry_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local hist_key, tail_key = KEYS[4], KEYS[5]
local job_id, now, maxlen = ARGV[1], now_ms(ARGV[2]), tonumber(ARGV[3])
local now_s = string.format('%d', now)
local run_ttl, overlap, dry = ARGV[4], ARGV[5], ARGV[6] ~= ''
local hlen, tail, n = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local j = redis.call('HMGET', job_key, J.status, J.type, J.queue, 'version', 'active',
                     'buffered', 'bq_tail')
if j[2] and not j[1] then j[1] = DEFAULT_STATUS end  -- not stored while it is (layout)
if not j[1] then return {-1, ''} end
if j[1] == 'cancelled' then return {-2, j[1]} end
-- bufferAll: the new runs follow the last one an earlier bufferAll backfill left waiting or
-- running (prev, its key prev_key); one that has ended left nothing to follow.
local prev, prev_key = nil, nil
if overlap == 'a' and not dry then
  if (j[7] or '') ~= tail then return {-3, j[7] or ''} end
  if tail ~= '' then
    local st = redis.call('HGET', tail_key, 'state')
    if st == 'retry_wait' or st == 'buffered' or st == 'dispatched' or st == 'running'
      or st == 'waiting' then
      prev, prev_key = tail, tail_key
    end
  end
end
local jtype, queue, version, active, buffered = j[2], j[3] or DEFAULT_QUEUE, j[4] or '1', j[5] or '', j[6] or ''
if dry and ARGV[6] ~= '=' then active, buffered = string.match(ARGV[6], '^(.-)|(.*)$') end
local queued = batch_new(events_key, maxlen, {'e', 'triggered', 'j', job_id, 't', now_s,
                                              'ty', jtype}, {'r'})
local skips = batch_new(events_key, maxlen, {'e', 'skipped', 'j', job_id, 't', now_s,
                                             'ty', jtype, 'q', queue}, {'r', 's', 'err'})
local out = {1, j[1]}
local last = nil
for i = 1, n do
  local sched = ARGV[9 + i]
  local run_id, run_key = job_id .. '@' .. sched, KEYS[5 + i]
  local state = redis.call('HGET', run_key, 'state')
  local code = 0
  if state and state ~= 'skipped' then
    code = 0
  elseif overlap == 'a' then
    -- bufferAll: at once when nothing runs before it, else behind the run before it.
    code = 3
    if dry then
      if active == '' then active, code = run_id, 1 end
    else
      redis.call('DEL', run_key)
      if not prev and active == '' then
        redis.call('HSET', run_key, 'attempt', '0', 'state', 'retry_wait', 'fence', '0',
                   'worker', '', 'queue', queue, 'type', jtype, 'v', version, 'ov', '1')
        redis.call('HSET', job_key, 'active', run_id)
        redis.call('ZADD', retry_key, now_s, run_id)
        queued[1][batch_slot(queued)] = run_id
        last, active, code = run_id, run_id, 1
      else
        redis.call('HSET', run_key, 'attempt', '0', 'state', 'buffered', 'queue', queue,
                   'type', jtype, 'ov', '1', 'v', version)
        if prev then
          redis.call('HSET', prev_key, 'bnext', run_id)
        else
          redis.call('HSET', job_key, 'bq', run_id)  -- waits for the job's own active run
        end
      end
      prev, prev_key = run_id, run_key
    end
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
      remember(job_key, hist_key, hlen, false, nil, {run = run_id, attempt = 0,
               status = 'skipped', sched_ms = tonumber(sched), ended_ms = now, error = why})
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
if prev and prev ~= tail then redis.call('HSET', job_key, 'bq_tail', prev) end
batch_flush(queued)
batch_flush(skips)
return out
