--[[ start: a worker records that it runs these runs: reclaimed entries (XAUTOCLAIM) before
their handler runs, fresh entries (XREADGROUP) once their handler has run a while.

Each start gives the run a new fencing token; the worker must present it to heartbeat and
complete.  Only the entry's current delivery may start it: the caller must own the entry in the
group's pending list.  A worker that stalled while XAUTOCLAIM moved its entry to another consumer
still knows the entry id, but its start is rejected (fence -1), counted ('fenced' in stats) and
logged as a 'fenced' event, whatever state the run is in.  A run still 'running' under another
worker when its owner (the reclaimer) starts it was abandoned by that worker (the stream entry
went idle because its heartbeats stopped): that attempt is recorded as abandoned and a new one
starts, or the run is dead-lettered when its attempts are used up; a cancelled job's abandoned
run is not started again, nor is a reclaimed run never started that is past its job's start
deadline (missed_start in include deadline: dead-lettered).  A fresh run ('dispatched') starts
even if its job was cancelled meanwhile: its occurrence was already handed out, and its handler
may be running.  Entries whose
run is gone, finished or re-dispatched under a newer entry are acknowledged (claim trims
acknowledged entries).
A run a worker without its handler set aside (park.lua: its entry pending under the consumer
ARGV[7] .. <type>, field 'nh' naming the entry) is taken from there by a worker with the handler
(reclaimed '2': XCLAIM to the caller first), or reclaimed by XAUTOCLAIM once idle; either way a
run still 'dispatched' so set aside spent no attempt and starts with the same one (a 'running'
one was abandoned by its worker before it was set aside: that attempt counts).

KEYS[1]  rsched:{pN}:events  STREAM     KEYS[2] rsched:{pN}:stats HASH
KEYS[3]  rsched:{pN}:dead    ZSET       KEYS[4] rsched:{pN}:retry ZSET (a buffered run let go
         when an abandoned run under an overlap policy ends: release_active in include overlap)
then per run 4 keys: rsched:{pN}:run:<run id> HASH (the job key again for a one-off job's own
                     run: see run_fields in util), rsched:{pN}:job:<id> HASH,
                     rsched:{pN}:q:<queue> STREAM, rsched:{pN}:hist:<id> LIST
ARGV[1] worker id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen
ARGV[4] group       ARGV[5] n runs                     ARGV[6] history length
ARGV[7] parked consumers' prefix (park.lua)
then per run 4 values (from ARGV[8]): run id, stream entry id, elapsed_ms (how long its handler
  has run already),
  reclaimed ('1' = taken over from another consumer by XAUTOCLAIM: a run still 'dispatched'
  then lost an attempt whose worker stopped before recording its start, and that attempt
  counts, so a job that kills its workers at once still ends in the dead letters; '2' = taken
  from the consumer of runs of its type set aside, see above)
Returns {fence_1, attempt_1, ..., fence_n, attempt_n}; fence 0 = do not run this entry (finished,
  gone or cancelled: acknowledged; reclaimed '2': or taken by another worker first, not
  acknowledged), fence -1 = fenced: the entry is delivered to another consumer
  now (not acknowledged: it is theirs)
The call's 'started' events share one events-stream entry (batch_flush in util).
A run ended here without starting again (its job cancelled: 'abandoned'; cancelPrevious asked it
to stop: 'cancelled') is recorded in the job's history like any other ended attempt.
A run that ends here (dead-lettered, or not started again for its cancelled job) frees its
limit slot if its job has a limit key; a reclaimed run that starts again keeps it (the slot
belongs to the run id, now under the new fence).  include limits builds those keys from the
partition's prefix and may PUBLISH on the wake channel.
]]
--!include layout
--!include util
--!include defaults
--!include life
--!include streak
--!include dead_letter
--!include deadline
--!include delivery
--!include overlap
--!include limits
-- The globals the per-run loop reads, as locals: a global is a table lookup each time.
local ARGV, KEYS, tonumber, format = ARGV, KEYS, tonumber, string.format
local events_key, stats_key, dead_key, retry_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker = ARGV[1]
local now = now_ms(ARGV[2])
local now_s = format('%d', now)
local maxlen, group, n, hlen = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local parked = ARGV[7]
-- A run that ends here (dead-lettered, or its job cancelled) frees its limit slot, if its job
-- has a limit key (include limits, which builds its keys from the partition's prefix).
local prefix = lim_prefix(events_key)
local function free_slot(job_key, run_id)
  local lkey = redis.call('HGET', job_key, J.limit_key)
  if lkey then lim_drop(prefix, lkey, run_id, retry_key, now) end
end
local out = {}
-- The call's 'started' events share one events-stream entry (batch_new in util).
local started_events = batch_new(events_key, maxlen, {'e', 'started', 'w', worker},
                                 {'r', 'a', 't', 'f', 'ty'}, n)
-- Its columns as locals (a flush empties the batch but keeps them): no table read per value.
local ev_r, ev_a, ev_t, ev_f, ev_ty = unpack(started_events, 1, 5)
-- The run id holds the job id and the scheduled time, read off it only where a path needs them
-- (a fresh run's start, the common case, does not: the match is costly per run).
local function job_and_sched(run_id) return string.match(run_id, '^(.*)@(%d+)$') end
for i = 1, n do
  local c = 7 + 4 * (i - 1)
  local run_id, sid, elapsed, reclaimed = ARGV[c + 1], ARGV[c + 2], tonumber(ARGV[c + 3]), ARGV[c + 4]
  local b = 4 + 4 * (i - 1)
  local run_key, job_key, stream_key, hist_key = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4]
  local F = run_fields(run_key, job_key)
  -- Each field an HMGET asks for scans the hash (an absent one all of it): a fresh entry's start
  -- (the common case) reads neither the start time (of an abandoned attempt) nor the dispatch
  -- time (of a reclaimed run's start deadline), and an own run has no 'ov' (overlap runs recur).
  local r, started_ms, ov, dispatched_ms
  if reclaimed ~= '0' then
    r = redis.call('HMGET', run_key, F.state, F.attempt, F.fence, F.stream_id, F.worker,
                   F.type, F.started_ms, 'ov', F.dispatched_ms, 'nh')
    started_ms, ov, dispatched_ms = r[7], r[8], r[9]
  elseif F == OWN_RUN then
    r = redis.call('HMGET', run_key, F.state, F.attempt, F.fence, F.stream_id, F.worker,
                   F.type)
  else
    r = redis.call('HMGET', run_key, F.state, F.attempt, F.fence, F.stream_id, F.worker,
                   F.type, 'ov')
    ov = r[7]
  end
  -- A run the claim created has no fence or worker field yet.
  local job_id, sched
  local state, attempt, fence = r[1], tonumber(r[2] or '0'), tonumber(r[3] or '0')
  local run_worker, jtype = r[5] or '', r[6]
  local fence_out, attempt_out = 0, attempt
  local live = state and r[4] == sid and (state == 'dispatched' or state == 'running')
  local owner = live and delivered_to(stream_key, group, sid)
  local adopt = reclaimed == '2'
  if adopt and owner and string.sub(owner, 1, #parked) == parked then
    redis.call('XCLAIM', stream_key, group, worker, 0, sid, 'JUSTID')
    owner = worker
  end
  -- Set aside under this very entry (park.lua) and never started since: no attempt was spent.
  local set_aside = reclaimed ~= '0' and r[10] and string.sub(r[10], 1, #sid + 1) == sid .. ' '
  if not live then
    redis.call('XACK', stream_key, group, sid)
  elseif adopt and owner ~= worker then
    fence_out = 0  -- another worker with the handler took it first
  elseif owner ~= worker then
    fence_out = -1
    job_id = job_and_sched(run_id)
    redis.call('HINCRBY', stats_key, 'fenced', 1)
    emit(events_key, maxlen, 'e', 'fenced', 'j', job_id, 'r', run_id, 'a', attempt, 't', now,
         'w', worker, 'f', fence, 'ty', jtype or '',
         'err', 'stale start rejected: the stream entry is delivered to '
                .. (owner or 'nobody') .. ' now')
  elseif state == 'running' and run_worker == worker then
    fence_out = fence  -- the same call applied twice (client retry): nothing new happened
  elseif state == 'dispatched' and reclaimed ~= '0'
      and missed_start(redis.call('HGET', job_key, J.spec), run_id, r[2], dispatched_ms, now) then
    -- Never started, and too late now (startDeadlineSeconds): dead-lettered, never run late.
    job_id = job_and_sched(run_id)
    dead_letter(run_key, job_key, F, dead_key, events_key, stats_key, maxlen, now, run_id,
                job_id, attempt, 'missed start deadline', jtype)
    free_slot(job_key, run_id)
    redis.call('XACK', stream_key, group, sid)
  else
    if r[10] then redis.call('HDEL', run_key, 'nh') end
    if state == 'running' or (reclaimed == '1' and not set_aside) then
      job_id, sched = job_and_sched(run_id)
      local err = 'worker ' .. run_worker .. ' stopped heartbeating'
      if state == 'dispatched' then err = 'its worker stopped before recording the start' end
      if reclaimed == '0' then started_ms = redis.call('HGET', run_key, F.started_ms) end
      remember(job_key, hist_key, hlen, F == OWN_RUN, sid, {run = run_id, attempt = attempt,
               status = 'abandoned', worker = run_worker, sched_ms = tonumber(sched),
               started_ms = tonumber(started_ms), ended_ms = now, error = err})
      emit(events_key, maxlen, 'e', 'abandoned', 'j', job_id, 'r', run_id, 'a', attempt, 't', now,
           'w', run_worker, 'ty', jtype, 'err', err)
      emit(events_key, maxlen, 'e', 'reclaimed', 'j', job_id, 'r', run_id, 'a', attempt, 't', now,
           'w', worker, 'ty', jtype)
      redis.call('HINCRBY', stats_key, 'reclaimed', 1)
      attempt = attempt + 1
      local max_attempts = tonumber(redis.call('HGET', job_key, J.max_attempts) or '')
        or DEFAULT_MAX_ATTEMPTS  -- not stored when it is the default
      if attempt > max_attempts then
        dead_letter(run_key, job_key, F, dead_key, events_key, stats_key, maxlen, now, run_id,
                    job_id, attempt - 1, err, jtype)
        if ov == '1' then release_active(job_key, retry_key, run_id, now, run_key) end
        free_slot(job_key, run_id)
        redis.call('XACK', stream_key, group, sid)
        state = nil
      end
    end
    local js = state and (r[1] == 'running' or reclaimed ~= '0')
      and redis.call('HMGET', job_key, J.status, 'cancel')
    if js and (js[1] == 'cancelled' or js[2] == run_id) then
      -- the job was cancelled, or overlap cancelPrevious asked this run to stop
      local st, why, note = 'abandoned', 'job cancelled',
                            'job cancelled: its abandoned run is not started again'
      if js[1] ~= 'cancelled' then st, why, note = 'cancelled', STOPPED, STOPPED end
      local sched_s
      job_id, sched_s = job_and_sched(run_id)
      redis.call('HSET', run_key, F.state, st, F.ended_ms, now, F.error, why)
      remember(job_key, hist_key, hlen, F == OWN_RUN, sid, {run = run_id, attempt = attempt,
               status = st, sched_ms = tonumber(sched_s), ended_ms = now, error = why})
      emit(events_key, maxlen, 'e', st, 'j', job_id, 'r', run_id, 'a', attempt, 't', now,
           'ty', jtype, 'err', note)
      if ov == '1' then release_active(job_key, retry_key, run_id, now, run_key) end
      free_slot(job_key, run_id)
      redis.call('XACK', stream_key, group, sid)
    elseif state then
      fence_out = fence + 1
      -- Numbers as text once, for the write and the event (Redis 7.0 formats a Lua number with
      -- snprintf on every call); the attempt is written only when it changed (a reclaim).
      local fence_s, started_s = format('%d', fence_out), format('%d', now - elapsed)
      local attempt_s = r[2]
      if attempt_s and attempt == tonumber(attempt_s) then
        redis.call('HSET', run_key, F.state, 'running', F.worker, worker, F.fence, fence_s,
                   F.started_ms, started_s, F.hb_ms, now_s)
      else
        attempt_s = format('%d', attempt)
        redis.call('HSET', run_key, F.state, 'running', F.worker, worker, F.fence, fence_s,
                   F.attempt, attempt_s, F.started_ms, started_s, F.hb_ms, now_s)
      end
      local k = batch_slot(started_events)
      ev_r[k], ev_a[k], ev_t[k], ev_f[k], ev_ty[k] = run_id, attempt_s, started_s, fence_s,
        jtype or ''
    end
    attempt_out = attempt
  end
  out[2 * i - 1] = fence_out
  out[2 * i] = attempt_out
end
batch_flush(started_events)
lim_index(prefix)
return out
