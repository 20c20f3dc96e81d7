--[[ complete: record the outcome of runs, fenced; retry, dead-letter or finish.

A report is accepted only from the worker that holds the run's current fencing token; anything
else is logged as 'fenced' and changes nothing (its stream entry is not acknowledged either,
since a dead worker's XACK would succeed on an entry another consumer now owns).  A run that
finished before its worker recorded its start (fence '0': workers start fresh runs at once and
record the start only of runs still going after a moment) is started here first, under the same
checks start.lua applies to a fresh entry: still 'dispatched', under this very stream entry.
It does not ask whether the entry is still delivered to the caller (start.lua does): a run still
'dispatched' has no attempt recorded under anyone, so the first write wins, and a reclaimer whose
start lands later finds the run finished, acknowledges it and runs nothing.  Asking would cost an
XPENDING per run on the hottest path.
Such a run has no 'started' history event: its outcome event records the start as 'st' (the
handler's start time) and 'f' (its fence), and the archive reads the start from there.  The
call's 'succeeded' events share one events-stream entry (batch_flush in util).  A run dispatched
under an overlap policy (field 'ov') lets go of its job's active-run record when it succeeds or
is dead-lettered (release_active in include overlap), not when it waits for a retry.  A run
that is not a one-off job's own ends its job's failure streak when it succeeds (include streak).
A one-off job its own run completes stores no updated_ms: that run's end is it (core.layout).
Outcome 'cancelled' (the worker stopped a run overlap cancelPrevious asked to stop,
heartbeat.lua) is final: no retry, no dead letter, the active-run record released.
Outcome 'deferred' (the handler raised rsched.RateLimited) puts the run back in the retry set
after retry_delay_ms with its attempt given back, at most MAX_DEFERRALS times a run (counted in
its field 'dfr'), after which it is a failed attempt.  Outcome 'held' (the run's queue-wide
limit gave it no permit, lua/queue_permit.lua: its handler never started) is recorded as a
'deferred' one that is not counted in 'dfr', its state 'waiting' for 'queue <queue>'.  Any accepted outcome of a run whose job
has a limit key (job field 'lk') frees the run's slot (include limits, which builds its keys
from the partition's prefix and may PUBLISH on the wake channel).

KEYS[1] rsched:{pN}:events STREAM   KEYS[2] rsched:{pN}:stats HASH
KEYS[3] rsched:{pN}:retry  ZSET     KEYS[4] rsched:{pN}:dead  ZSET
KEYS[5 .. 4+g] per group of runs (g = ARGV[5]) the queue stream its runs came from,
               rsched:{pN}:q:<queue> STREAM (twice when a queue's runs form two groups; the
               runs' queue is read off its name)
then per run, group by group: a one-off job's own run 1 key, rsched:{pN}:job:<id> HASH (its
     fields and its history live in the job hash: see run_fields in util); any other run 3 keys,
     rsched:{pN}:run:<run id> HASH, rsched:{pN}:job:<id> HASH, rsched:{pN}:hist:<id> LIST
ARGV[1] worker id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] group       ARGV[5] g groups of runs          ARGV[6] history length
ARGV[7] run_ttl_ms: how long a finished run's hash is kept (0 = forever; a one-off job's own
        run lives in the job hash, kept as long as the job)
ARGV[8] finished_ttl_ms: how long a completed one-off job and its own run are kept (0 = forever)
then per group 2 values (from ARGV[9]): n runs, kind: own ('1': one-off jobs' own runs, '0':
  others), then 's' when every run of the group succeeded
then per run, group by group (from ARGV[9 + 2g]) 6 values: run id, fence ('0' = start not
  recorded yet), duration_ms, text (JSON result when succeeded, error message otherwise), stream
  entry id, elapsed_ms (since the handler started); then, unless the group's kind ends in 's',
  2 more: outcome ('succeeded' | 'failed' | 'timed_out' | 'cancelled' | 'deferred' | 'held'),
  retry_delay_ms (-1 with 'failed': final, the run is dead-lettered at once whatever attempts
  remain: the handler raised AttemptFailed(final=True), as an HTTP target's 404 does)
The groups save arguments on the hottest path (a one-off job's own run that succeeded: 7 instead
of 12; Redis parses each).
Returns {code_1, ..., code_n}
  1 succeeded recorded   2 retry scheduled   3 dead-lettered   4 cancelled recorded
  0 duplicate report of an outcome already recorded (client retry)   -1 fenced (stale token)
]]
--!include layout
--!include util
--!include defaults
--!include life
--!include streak
--!include dead_letter
--!include overlap
--!include limits
-- The globals the per-run loop reads, as locals: a global is a table lookup each time.
local ARGV, KEYS, tonumber, unpack = ARGV, KEYS, tonumber, unpack
local format, find = string.format, string.find
local events_key, stats_key, retry_key, dead_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker = ARGV[1]
local now = now_ms(ARGV[2])
-- Redis 7.0 formats every Lua number passed to redis.call with snprintf: the success path
-- passes strings.
local now_s = string.format('%d', now)
local maxlen, group, groups, hlen = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local run_ttl, finished_ttl = tonumber(ARGV[7]), tonumber(ARGV[8])
local prefix = lim_prefix(events_key)  -- limit keys are built from it (include limits)
-- The run id holds the job id and the scheduled time (read only off the hot path).
local function job_of(run_id) return string.match(run_id, '^(.*)@%d+$') end
local out = {}
local acks = {}  -- stream key -> entry ids, acknowledged with one XACK per stream at the end
local ok_count, fail_count = 0, 0
-- An outcome event of its own (a failure, or a result a batch cannot hold); `started` = {start
-- ms, fence} when the run starts and ends in this call (no 'started' event of its own).
local function outcome_event(outcome, run_id, attempt_s, duration_s, jtype, queue, field, text,
                             started)
  if started then
    emit(events_key, maxlen, 'e', outcome, 'r', run_id, 'a', attempt_s, 't', now_s, 'w', worker,
         'd', duration_s, 'ty', jtype, 'q', queue, field, text, 'st', started[1], 'f', started[2])
  else
    emit(events_key, maxlen, 'e', outcome, 'r', run_id, 'a', attempt_s, 't', now_s, 'w', worker,
         'd', duration_s, 'ty', jtype, 'q', queue, field, text)
  end
end
local n = 0
for g = 1, groups do n = n + tonumber(ARGV[7 + 2 * g]) end
-- Every 'succeeded' event of the call goes into one stream entry (batch_new in util), its
-- columns sized for all of the call's runs.
local succeeded_events = batch_new(events_key, maxlen,
                                   {'e', 'succeeded', 't', now_s, 'w', worker},
                                   {'r', 'a', 'd', 'ty', 'q', 'res', 'st', 'f'}, n)
-- Its columns as locals (a flush empties the batch but keeps them): no table read per value.
local ev_r, ev_a, ev_d, ev_ty, ev_q, ev_res, ev_st, ev_f = unpack(succeeded_events, 1, 8)
-- A success's HSET arguments: one table for the call's runs, sized once for the longest write
-- (12 values, the result and the job's end), not a table per run to allocate and collect.
local success_write = {false, false, false, false, false, false, false, false, false, false,
                       false, false, false, false, false, false}
-- The current group, its runs still to come, and where the next run's values and keys start.
local g, left, vi, ki = 0, 0, 8 + 2 * groups, 4 + groups
-- The group's: whether its runs are own runs, their stream and queue, their field names, and
-- how many values a run has (6 when all succeeded); the entry ids its stream acknowledges, and
-- how many it holds (a queue's two groups share them).
local own, stream_key, queue, F, stride, ack_ids, nack
for i = 1, n do
  while left == 0 do
    g = g + 1
    left = tonumber(ARGV[7 + 2 * g])
    local kind = ARGV[8 + 2 * g]
    own, stream_key = string.sub(kind, 1, 1) == '1', KEYS[4 + g]
    stride = string.sub(kind, 2) == 's' and 6 or 8
    -- A run's queue is its stream's (a job's queue never changes, and claim.lua sends its runs
    -- to that queue's stream, naming it the same way), so no hash is asked for it: an own run's
    -- job stores no queue at the default, and asking for an absent field scans the whole hash.
    queue = string.match(stream_key, ':q:(.*)$')
    F = run_names(own)  -- run_fields in util: the run key is the job key
    ack_ids = acks[stream_key]
    if not ack_ids then
      ack_ids = {}
      acks[stream_key] = ack_ids
    end
    nack = #ack_ids
  end
  left = left - 1
  -- Numbers are read off the hot path only (tonumber is a strtod): a success keeps the strings.
  local run_id, fence, duration_s, text, sid = ARGV[vi + 1], ARGV[vi + 2], ARGV[vi + 3],
    ARGV[vi + 4], ARGV[vi + 5]
  local elapsed, outcome, delay_s = tonumber(ARGV[vi + 6]), 'succeeded', nil
  if stride == 8 then outcome, delay_s = ARGV[vi + 7], ARGV[vi + 8] end
  vi = vi + stride
  local duration = nil
  local run_key, job_key, hist_key
  if own then
    job_key = KEYS[ki + 1]
    run_key, ki = job_key, ki + 1
  else
    run_key, job_key, hist_key = KEYS[ki + 1], KEYS[ki + 2], KEYS[ki + 3]
    ki = ki + 3
  end
  -- An own run is read with the job fields that decide whether the job ends with it: one HMGET.
  -- Another run, with its 'ov' (an own run has none: overlap runs recur); ov = '1' then.  Its
  -- worker and start time matter only to a run not starting here: a run whose start is not
  -- recorded (fence '0', the common case) reads them after the fact, when it is not 'dispatched'
  -- under this entry.  (Each field an HMGET asks for scans the hash; one absent scans it all.)
  local r, ov, run_worker, started_ms
  local late = fence ~= '0'
  if own then
    if late then
      r = redis.call('HMGET', run_key, F.state, F.fence, F.attempt, F.stream_id, F.type, J.status,
                     J.cron, J.next_ms, F.worker, F.started_ms, J.limit_key)
    else
      r = redis.call('HMGET', run_key, F.state, F.fence, F.attempt, F.stream_id, F.type, J.status,
                     J.cron, J.next_ms, J.limit_key)
    end
  else
    if late then
      r = redis.call('HMGET', run_key, F.state, F.fence, F.attempt, F.stream_id, F.type, 'ov',
                     F.worker, F.started_ms)
    else
      r = redis.call('HMGET', run_key, F.state, F.fence, F.attempt, F.stream_id, F.type, 'ov')
    end
    ov = r[6] == '1'
  end
  local state, run_fence, attempt_s, stream_id, jtype = r[1], r[2], r[3], r[4], r[5]
  -- The job's limit key (include limits): an own run's is read above, another's with its job.
  local lkey = own and r[late and 11 or 9] or nil
  if late then
    run_worker, started_ms = r[own and 9 or 7], r[own and 10 or 8]
  end
  -- A run the claim created has no fence or worker field until it starts.  starting: it starts
  -- here (its worker, fence and started_ms are written with its outcome).
  local starting = false
  if not late then
    if state == 'dispatched' and stream_id == sid then
      -- Start and finish in one go: no 'started' event of its own, the outcome event carries the
      -- handler's real start time ('st') and the fence ('f'): one XADD per run fewer.
      -- (Strings, not numbers: Redis formats a Lua number with snprintf on every call.)
      fence = run_fence and format('%d', tonumber(run_fence) + 1) or '1'
      state, run_worker, run_fence, started_ms = 'running', worker, fence,
        format('%d', now - elapsed)
      starting = true
    else
      local w = redis.call('HMGET', run_key, F.worker, F.started_ms)
      run_worker, started_ms = w[1], w[2]
      if stream_id == sid and run_worker == worker then
        fence = run_fence  -- our start landed after all (a retried call): judge by its fence
      end
    end
  end
  if state == 'running' and run_worker == worker and run_fence == fence then
    local attempt = nil
    if outcome == 'succeeded' then
      -- A one-off job's own run decides from the fields read above whether its job ends
      -- (one_off_done).
      local done = own and one_off_ends(r[6], r[7], r[8])
      if done then
        -- The hottest writes (a one-off job's own run ends and its job with it), arguments in
        -- place rather than a table filled and unpacked.  The fields and their order are the
        -- general write's below, then the job's status.  No updated_ms: a job its own run
        -- completes was last updated when that run ended (layout; a field inserted last is
        -- the longest listpack scan).
        if starting and text == 'null' then
          redis.call('HSET', job_key, OWN.state, 'succeeded', OWN.ended_ms, now_s, OWN.duration_ms,
                     duration_s, OWN.worker, worker, OWN.fence, fence, OWN.started_ms, started_ms,
                     J.status, 'completed')
        elseif starting then
          redis.call('HSET', job_key, OWN.state, 'succeeded', OWN.ended_ms, now_s, OWN.duration_ms,
                     duration_s, OWN.worker, worker, OWN.fence, fence, OWN.started_ms, started_ms,
                     OWN.result, text, J.status, 'completed')
        elseif text == 'null' then  -- its start was recorded before (start.lua)
          redis.call('HSET', job_key, OWN.state, 'succeeded', OWN.ended_ms, now_s, OWN.duration_ms,
                     duration_s, J.status, 'completed')
        else
          redis.call('HSET', job_key, OWN.state, 'succeeded', OWN.ended_ms, now_s, OWN.duration_ms,
                     duration_s, OWN.result, text, J.status, 'completed')
        end
      else
        -- The call's one write table (w[1 .. nw] is written), refilled run by run.
        local w, nw = success_write, 6
        w[1], w[2], w[3], w[4], w[5], w[6] = F.state, 'succeeded', F.ended_ms, now_s,
          F.duration_ms, duration_s
        if starting then
          w[7], w[8], w[9], w[10], w[11], w[12], nw = F.worker, worker, F.fence, fence,
            F.started_ms, started_ms, 12
        end
        -- A handler's None ('null') is not stored: an absent result reads as None (models.Run).
        if text ~= 'null' then w[nw + 1], w[nw + 2], nw = F.result, text, nw + 2 end
        if own then  -- a job that goes on (rescheduled or made recurring meanwhile)
          redis.call('HSET', job_key, unpack(w, 1, nw))
        else
          redis.call('HSET', run_key, unpack(w, 1, nw))
          -- Other runs expire (their record stays in the job's history list).
          if run_ttl > 0 then redis.call('PEXPIRE', run_key, ARGV[7]) end
          -- one_off_done, read with the job's failure streak, which a success ends (streak):
          -- deleting an absent field is a command for nothing.
          local j = redis.call('HMGET', job_key, J.status, J.cron, J.next_ms, 'fails', J.limit_key)
          lkey = j[5]
          done = one_off_ends(j[1], j[2], j[3])
          if done then redis.call('HSET', job_key, J.status, 'completed', J.updated_ms, now_s) end
          if j[4] then redis.call('HDEL', job_key, 'fails') end
        end
      end
      if done and finished_ttl > 0 then redis.call('PEXPIRE', job_key, ARGV[8]) end
      if find(text, '\n', 1, true) then
        -- Not JSON as workers send it: an event of its own, since batches join values by '\n'.
        outcome_event('succeeded', run_id, attempt_s, duration_s, jtype, queue, 'res', text,
                      starting and {started_ms, fence})
      else
        local k = batch_slot(succeeded_events)
        ev_r[k], ev_a[k], ev_d[k], ev_ty[k], ev_q[k], ev_res[k] =
          run_id, attempt_s, duration_s, jtype, queue, text
        if starting then
          ev_st[k], ev_f[k] = started_ms, fence
        else
          ev_st[k], ev_f[k] = '', ''
        end
      end
      if ov then release_active(job_key, retry_key, run_id, now_s, run_key) end
      ok_count = ok_count + 1
      out[i] = 1
    else
      attempt, duration = tonumber(attempt_s), tonumber(duration_s)
      local delay = tonumber(delay_s)
      if starting then
        redis.call('HSET', run_key, F.worker, worker, F.fence, fence, F.started_ms, started_ms)
      end
      local held = outcome == 'held'  -- held by its queue's limit: deferred, not counted
      if held then outcome = 'deferred' end
      -- RateLimited: at most MAX_DEFERRALS times a run, then a failed attempt like any other.
      if outcome == 'deferred' and not held
          and redis.call('HINCRBY', run_key, 'dfr', 1) > MAX_DEFERRALS then
        outcome = 'failed'
        text = text .. ' (deferred ' .. MAX_DEFERRALS .. ' times: counted as a failed attempt)'
      end
      outcome_event(outcome, run_id, attempt_s, duration_s, jtype, queue, 'err', text,
                    starting and {started_ms, fence})
      if outcome ~= 'cancelled' and outcome ~= 'deferred' then fail_count = fail_count + 1 end
      local job_id = job_of(run_id)
      local j = redis.call('HMGET', job_key, J.max_attempts, J.limit_key)
      local max_attempts = tonumber(j[1] or '') or DEFAULT_MAX_ATTEMPTS  -- absent: the default
      lkey = j[2]
      if outcome == 'deferred' then
        -- The attempt is given back: the retry's dispatch counts it again.
        redis.call('HSET', run_key, F.state, 'retry_wait', F.attempt, format('%d', attempt - 1),
                   F.ended_ms, now, F.duration_ms, duration, F.error, text)
        if held then redis.call('HSET', run_key, F.state, 'waiting', F.waiting, 'queue ' .. queue) end
        redis.call('ZADD', retry_key, now + delay, run_id)
        emit(events_key, maxlen, 'e', 'retry_scheduled', 'j', job_id, 'r', run_id, 'a', attempt,
             't', now, 'at', now + delay, 'ty', jtype)
        out[i] = 2
      elseif outcome == 'cancelled' then
        redis.call('HSET', run_key, F.state, 'cancelled', F.ended_ms, now, F.duration_ms, duration,
                   F.error, text)
        if run_ttl > 0 and not own then redis.call('PEXPIRE', run_key, ARGV[7]) end
        if ov then release_active(job_key, retry_key, run_id, now, run_key) end
        out[i] = 4
      elseif attempt < max_attempts and delay >= 0 then
        redis.call('HSET', run_key, F.state, 'retry_wait', F.ended_ms, now, F.duration_ms, duration,
                   F.error, text)
        redis.call('ZADD', retry_key, now + delay, run_id)
        redis.call('HINCRBY', stats_key, 'retried', 1)
        emit(events_key, maxlen, 'e', 'retry_scheduled', 'j', job_id, 'r', run_id, 'a', attempt,
             't', now, 'at', now + delay, 'ty', jtype)
        out[i] = 2
      else
        redis.call('HSET', run_key, F.duration_ms, duration)
        dead_letter(run_key, job_key, F, dead_key, events_key, stats_key, maxlen, now, run_id,
                    job_id, attempt, text, jtype)
        if ov then release_active(job_key, retry_key, run_id, now, run_key) end
        out[i] = 3
      end
    end
    if not own or outcome ~= 'succeeded' then
      -- The success of a one-off job's own run needs no record: its fields in the job hash,
      -- kept as long as the job, hold it
      -- (Client.runs reads them back).  On the hottest path that saves a third of this script's
      -- time (and the record is built only when kept).
      local rec = {run = run_id, attempt = attempt or tonumber(attempt_s), status = outcome,
                   worker = worker, sched_ms = tonumber(string.match(run_id, '@(%d+)$')),
                   started_ms = tonumber(started_ms), ended_ms = now,
                   duration_ms = duration or tonumber(duration_s)}
      if outcome == 'succeeded' then rec.result = text else rec.error = text end
      remember(job_key, hist_key, hlen, own, stream_id, rec)
    end
    -- Its slot, if its key limits it, is freed under the fence just checked (include limits).
    if lkey then lim_release(prefix, lkey, run_id, retry_key, now) end
    nack = nack + 1
    ack_ids[nack] = stream_id
  elseif run_worker == worker and run_fence == fence and state ~= 'dispatched' and state then
    out[i] = 0
  else
    redis.call('HINCRBY', stats_key, 'fenced', 1)
    emit(events_key, maxlen, 'e', 'fenced', 'j', job_of(run_id) or '', 'r', run_id,
         'a', attempt_s or '', 't', now, 'w', worker, 'f', fence, 'ty', jtype or '',
         'err', 'stale report rejected: run fence is ' .. (run_fence or '0') .. ', caller had ' .. fence)
    out[i] = -1
  end
end
for stream_key, ids in pairs(acks) do
  for k = 1, #ids, 1000 do
    redis.call('XACK', stream_key, group, unpack(ids, k, math.min(k + 999, #ids)))
  end
end
if ok_count > 0 then redis.call('HINCRBY', stats_key, 'succeeded', ok_count) end
batch_flush(succeeded_events)
if fail_count > 0 then redis.call('HINCRBY', stats_key, 'failed', fail_count) end
lim_index(prefix)
return out
