--[[ claim: move due occurrences and due retries of one partition onto its queue streams.

The dispatcher passes what it read from the due and retry sets (plain reads); this script
re-checks everything against Redis's own clock and the stored state, so the call is safe to
apply twice and a stale dispatcher (old fence) changes nothing.  A one-off job needs nothing
from Python: the script reads it, finds its queue stream among the partition's streams (all of
them are passed, so every key touched is declared) and dispatches it.  A recurring job needs
its next time computed in Python: the first call hands it back in `needs`, the dispatcher
reads it and calls again with kind 'j' (it remembers recurring ids, so later rounds send them
that way at once).  A job whose queue stream was not passed comes back in
`needs` too (the dispatcher refreshes its list of the partition's queues).

KEYS[1]        rsched:{pN}:lease     HASH   owner, fence, expires_ms
KEYS[2]        rsched:{pN}:due       ZSET   job id -> due score (ms - priority/2048)
KEYS[3]        rsched:{pN}:retry     ZSET   run id -> due ms
KEYS[4]        rsched:{pN}:events    STREAM history
KEYS[5]        rsched:{pN}:stats     HASH   counters
KEYS[5+q]      rsched:{pN}:q:<queue_q>  STREAM, q = 1..nq: every queue of the partition
KEYS[5+nq+k]   k = 1..no: rsched:{pN}:job:<id> HASH of each one-off item
KEYS[5+nq+no+3i-2], KEYS[5+nq+no+3i-1], KEYS[5+nq+no+3i]  per item: rsched:{pN}:job:<id> HASH,
               rsched:{pN}:run:<run id> HASH (a one-off job's first occurrence, its own run, is
               kept in the job hash instead: see run_fields in util; the run key is then unused),
               rsched:{pN}:hist:<id> LIST (the job's history: skipped occurrences and runs
               ended here are recorded in it like any other ended attempt, remember in util)
KEYS[#KEYS-na+k-1]  k = 1..na: rsched:{pN}:run:<active_k> HASH, the active runs below
KEYS[#KEYS]    rsched:{pN}:dead      ZSET   dead letters (a one-off job past its start deadline)
Queue stream entries: r run id, t job type, a attempt (left out for a first attempt: 1), x packed
spec, o '1' for an own run (the worker then passes the job key as the run key), d the ms the run
was meant to start; job id and scheduled time are in the run id. d is written for a run from the
retry set (a backfill, a trigger, a released bufferOne run, a replay or a retry: its due ms
there), whose start lag counts from it, not from its scheduled time.
The call's 'dispatched' events share one events-stream entry (batch_flush in util).
ARGV[1]  owner        ARGV[2] fence        ARGV[3] now_ms (0 = Redis TIME)
ARGV[4]  events_maxlen (0 = unbounded)      ARGV[5] nq      ARGV[6] n items
ARGV[7]  consumer group of the queue streams (acknowledged entries are trimmed)
ARGV[8]  no: one-off items, then 1 value each (from ARGV[11]): job id.  Read from the due set
         as due; the job's stored next_ms, due by Redis's clock, is the occurrence claimed
         (run id <job id>@<next_ms>): a one-off job's due score is its next_ms give or take
         0.49 (priority), so 'score due' and 'next_ms <= now' agree, and a job rescheduled
         meanwhile is judged by its new time.  Only a job's first occurrence is claimed this
         way: anything else (recurring, unknown queue, gone, or a one-off job run before) is
         handed back.  One past its startDeadlineSeconds (include life) is dead-lettered
         instead, with the error 'missed start deadline' (its own run, attempt 1, recorded
         in the job's history like any other ended attempt).
ARGV[9]  run_ttl_ms: how long the hash of a run skipped by its overlap policy is kept (0 = ever)
ARGV[10] history_len: the job history list's bound (Settings.history_len; 0 = none kept)
then per item 8 values: kind, job id, run id, score, expected, next_ms, next_score, fire
  kind 'j' (an occurrence the dispatcher read, with the next time computed for a recurring
           job): score = its due score, expected = the job's next_ms (compare-and-set);
           next_ms/next_score = the following occurrence and its due score, '0' = none;
           run id = the occurrence to run (the latest of a gap, see core.catchup);
           fire '1' = run it, '0' = run nothing, 's' / 'b' / 'c' = run it under overlap skip /
           bufferOne / cancelPrevious: only if the job has no active run (job field 'active'),
           else it is recorded as a 'skipped' run, or with bufferOne and cancelPrevious
           becomes the job's one 'buffered' run (job field 'buffered'), which release_active
           (include overlap) sends through the retry set when the active run ends; with
           cancelPrevious the active run is asked to stop (job field 'cancel' = its run id:
           heartbeat.lua tells its worker, a reclaim or its retry ends it, see kind 'r'); a run
           dispatched so gets field 'ov' = '1' and is the job's active run.  An occurrence
           whose run hash exists (a backfill ran it, lua/backfill.lua) is not run again.  Every
           run hash written here records the job's version as 'v'.  Any of them may be followed by
           ' <count> <first_ms> <last_ms> <exact 0|1>': occurrences missed by more than the
           job's catch-up window, skipped together: one 'skipped' event (its run id the
           first's), and the job's 'gap' field.  A run dispatched or buffered counts in the
           job's 'runs' (while it has a maxRuns); at its maxRuns (include life), or with next_ms '0' (no occurrence
           left before its endAt), the job leaves the due set as 'completed'
           An active run that has ended (state succeeded, dead, abandoned, skipped, cancelled
           or deleted) or whose hash is gone, by a way no script let go of the record, is let
           go here as its end would have (a buffered run becomes the active one), counted in
           the stats hash's 'overlap_healed'; only a run among the active runs below is judged.
  kind 'r' (retry, replay or trigger of a run, or a buffered run let go): score = its due ms
           in the retry set; a retry of a run asked to stop (cancelPrevious) is recorded
           'cancelled' instead, one of a cancelled job 'abandoned': as the attempt it waited to
           make (its hash's attempt + 1), in the job's history too
then na values (na = what is left of ARGV, often none): active_1, ..., active_na: the active
  runs (job field 'active') of items under an overlap policy, as the dispatcher read them
Limits (include limits): a run whose job has a limit key (job field 'lk') starts only with a
slot of its key (concurrency) and room in its key's rate window; else it waits: state 'waiting'
(field 'waiting' names the definition), its attempt count unchanged, in the key's waiting set
and in no stream (a one-off job's first occurrence leaves the due set; a recurring one's run is
created so).  Waiting runs are admitted in order of their scheduled times, by an ending that
frees a slot (complete.lua, start.lua, expire.lua), a definition's change (limit.lua) or here,
and come back through the retry set holding their slot; one held by the rate comes back when
the window allows.  include limits builds the keys of a limit key's state from the partition's
prefix (read off KEYS[2]), the partition's limits hash among them, and may PUBLISH on the wake
channel; 'limit_deferred' in the stats hash counts runs made to wait, rsched:{pN}:limstats
(built there too) per definition name; the keys that took a slot go into rsched:{pN}:limrun
(one SADD a call: lua/limit_keys.lua reads it).
Returns {dispatched, skipped, earliest, needs_1, ..., needs_k}
  {-1} when the caller's lease or fence is stale; nothing was written
  earliest: the earliest due score left in the due or retry set ('' when both are empty)
  needs: ids handed back: job ids of one-off items to send again with kind 'j' (recurring,
         run before, queue stream not passed, or job hash gone), run ids of retries whose
         queue stream was not passed
]]
--!include layout
--!include util
--!include trim_acked
--!include overlap
--!include life
--!include streak
--!include dead_letter
--!include limits
local lease_key, due_key, retry_key, events_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, fence = ARGV[1], ARGV[2]
local now = now_ms(ARGV[3])
-- Redis 7.0 formats every Lua number passed to redis.call with snprintf: pass strings.
local now_s = string.format('%d', now)
local maxlen, nq, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local group = ARGV[7]
local no = tonumber(ARGV[8])
local run_ttl = ARGV[9]
local hlen = tonumber(ARGV[10])
local dead_key = KEYS[#KEYS]
local prefix = lim_prefix(due_key)  -- limit keys are built from it (include limits)

local l = redis.call('HMGET', lease_key, 'owner', 'fence', 'expires_ms')
if l[1] ~= owner or l[2] ~= fence or tonumber(l[3] or '0') <= now then
  return {-1}
end

local stream_at, used = {}, {}  -- queue name -> index of its stream in KEYS
for q = 1, nq do
  local stream_key = KEYS[5 + q]
  stream_at[string.match(stream_key, ':q:(.*)$')] = 5 + q
end

local dispatched, skipped, waiting = 0, 0, 0
local out = {0, 0, ''}
local unindex = {}  -- job ids leaving the due set: one ZREM for the whole call
-- Every 'dispatched' event of the call goes into one stream entry (batch_new in util).
local dispatched_events = batch_new(events_key, maxlen, {'e', 'dispatched', 't', now_s},
                                    {'r', 'a', 'ty', 'q'})
-- Its columns as locals (a flush empties the batch but keeps them): no table read per value.
local ev_r, ev_a, ev_ty, ev_q = unpack(dispatched_events, 1, 4)
local function dispatch_event(run_id, attempt, jtype, queue)
  local k = batch_slot(dispatched_events)
  ev_r[k], ev_a[k], ev_ty[k], ev_q[k] = run_id, attempt, jtype, queue
end

-- Record a run's attempt that ends here (skipped, cancelled, abandoned, dead) in the job's
-- history like any other ended attempt (remember in util): the job's runs list it, with its
-- reason.  own: the run is the job's own (its records go into the job hash).
local function record_end(job_key, hist_key, own, run_id, attempt, status, why)
  remember(job_key, hist_key, hlen, own, 'ended-' .. now_s,
           {run = run_id, attempt = tonumber(attempt), status = status,
            sched_ms = tonumber(string.match(run_id, '@(%d+)$')), ended_ms = now, error = why})
end

-- Dispatch a one-off job's first occurrence, its own run: the run's fields go into the job hash
-- (see run_fields in util), written with the job's own change in one HSET.
-- jtype, spec: the job's as read; last: its last_run_id as read; lkey: its limit key (nil:
-- none).  A run its limit holds waits instead (include limits): its own run is recorded as
-- 'waiting', attempt 0, and it leaves the due set.
local function dispatch_own(job_key, stream_key, job_id, run_id, jtype, queue, spec, last, lkey)
  -- startDeadlineSeconds: dead-lettered, never run late (spec_life costs one byte test here).
  local life = spec_life(spec)
  if life then
    if life[4] > 0 and now > tonumber(string.match(run_id, '@(%d+)$')) + life[4] then
      -- Its first attempt, ended before it began: attempt 1, recorded as any other.
      redis.call('HSET', job_key, J.next_ms, '0', J.last_run_id, run_id, J.own_run, run_id,
                 OWN.attempt, '1')
      dead_letter(job_key, job_key, run_names(true), dead_key, events_key, stats_key, maxlen, now,
                  run_id, job_id, '1', 'missed start deadline', jtype)
      record_end(job_key, nil, true, run_id, 1, 'dead', 'missed start deadline')
      unindex[#unindex + 1] = job_id
      skipped = skipped + 1
      return
    end
  end
  if lkey then
    local ok, d = lim_admit(prefix, lkey, run_id, retry_key, now, true)
    if not ok then
      redis.call('HSET', job_key, J.next_ms, '0', J.own_run, run_id, OWN.attempt, '0',
                 OWN.state, 'waiting', OWN.waiting, d and d.name or '')
      if last then redis.call('HSET', job_key, J.last_run_id, run_id) end
      unindex[#unindex + 1] = job_id
      lim_deferred(prefix, d)
      waiting = waiting + 1
      return
    end
  end
  local sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype, 'x', spec, 'o', '1')
  used[stream_key] = true
  -- last_run_id absent is the own run (core.models.Job.from_hash): written only over a
  -- trigger's, one field fewer to insert and store.
  if last then
    redis.call('HSET', job_key, J.next_ms, '0', J.last_run_id, run_id, J.own_run, run_id,
               OWN.attempt, '1', OWN.state, 'dispatched', OWN.dispatched_ms, now_s,
               OWN.stream_id, sid)
  else
    redis.call('HSET', job_key, J.next_ms, '0', J.own_run, run_id, OWN.attempt, '1',
               OWN.state, 'dispatched', OWN.dispatched_ms, now_s, OWN.stream_id, sid)
  end
  dispatch_event(run_id, '1', jtype, queue)
  unindex[#unindex + 1] = job_id
  dispatched = dispatched + 1
end
for i = 1, no do
  -- A one-off job's first occurrence: one argument and one key, nothing computed in Python.
  local job_id = ARGV[10 + i]
  local job_key = KEYS[5 + nq + i]
  local status, stored_next, jtype, queue, spec, cron, own_run, last_run, lkey = unpack(
    redis.call('HMGET', job_key, J.status, J.next_ms, J.type, J.queue, J.spec, J.cron, J.own_run,
               J.last_run_id, J.limit_key))
  if jtype and not status then status = DEFAULT_STATUS end  -- not stored while it is (layout)
  queue = queue or DEFAULT_QUEUE
  local next_ms = tonumber(stored_next) or 0
  local qi = stream_at[queue] or 0
  local stream_key = KEYS[qi]
  if not status or (cron and cron ~= '') or not stream_key or (own_run and own_run ~= '') then
    out[#out + 1] = job_id  -- recurring, unknown queue, gone or run before: the dispatcher reads it
  elseif status ~= 'scheduled' then
    -- Paused, cancelled or finished: such a job has no place in the due set (the scripts that
    -- change its status remove it); a left-over entry would look due forever.
    unindex[#unindex + 1] = job_id
    skipped = skipped + 1
  elseif next_ms == 0 or next_ms > now then
    skipped = skipped + 1
  else
    dispatch_own(job_key, stream_key, job_id, job_id .. '@' .. stored_next, jtype, queue, spec,
                 last_run, lkey)
  end
end
local a = 11 + no
local base = 5 + nq + no
-- Whether the active run run_id of a job has ended: its hash gone or its state final.  Only a
-- run whose key the dispatcher passed (the tail of ARGV and KEYS, read on first use) is judged;
-- another (the record changed since the dispatcher read it) counts as live.
local actives = nil
local function active_ended(run_id)
  if not actives then
    actives = {}
    local first = 11 + no + 8 * n
    local na = #ARGV - first + 1
    for k = 0, na - 1 do actives[ARGV[first + k]] = KEYS[#KEYS - na + k] end
  end
  local key = actives[run_id]
  if not key then return false end
  local state = redis.call('HGET', key, 'state')
  return not state or state == 'succeeded' or state == 'dead' or state == 'abandoned'
    or state == 'skipped' or state == 'cancelled' or state == 'deleted'
end
for i = 1, n do
  local kind, job_id, run_id, score = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  local expected, next_ms, next_score, fire = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  a = a + 8
  local k = base + 3 * i
  local job_key, run_key, hist_key = KEYS[k - 2], KEYS[k - 1], KEYS[k]

  if kind ~= 'r' then
    -- Due by Redis's clock, and still the occurrence that was read (compare-and-set on status
    -- and next_ms): a second apply, a paused or rescheduled job all find nothing to do.
    local status, stored_next, jtype, queue, spec, cron, own_run, version, last_run_id, lkey =
      unpack(redis.call('HMGET', job_key, J.status, J.next_ms, J.type, J.queue, J.spec, J.cron,
                        J.own_run, 'version', J.last_run_id, J.limit_key))
    if jtype and not status then status = DEFAULT_STATUS end  -- not stored while it is (layout)
    version = version or '1'  -- recorded with the run (field 'v'): the job version it ran with
    local once = (not cron or cron == '')
    queue = queue or DEFAULT_QUEUE
    local qi = stream_at[queue] or 0
    local stream_key = KEYS[qi]
    if status and status ~= 'scheduled' then
      -- Paused, cancelled or finished: such a job has no place in the due set (the scripts that
      -- change its status remove it); a left-over entry would look due forever.
      unindex[#unindex + 1] = job_id
      skipped = skipped + 1
    elseif score > now + 0.5 or stored_next ~= expected or not stream_key then
      skipped = skipped + 1
    elseif once and (not own_run or own_run == '') then
      -- A one-off job's first occurrence, handed back above for an unknown queue.
      dispatch_own(job_key, stream_key, job_id, run_id, jtype, queue, spec, last_run_id, lkey)
    else
      local last_run = nil
      local gap = ''
      if #fire > 1 then fire, gap = string.sub(fire, 1, 1), string.sub(fire, 3) end
      if gap ~= '' then
        local count, first, last = string.match(gap, '^(%d+) (%d+) (%d+)')
        local why = 'catch-up: ' .. count .. ' occurrence(s) up to ' .. last ..
                    ' missed by more than the catch-up window'
        emit(events_key, maxlen, 'e', 'skipped', 'j', job_id, 'r', job_id .. '@' .. first,
             't', now_s, 's', first, 'ty', jtype, 'q', queue, 'err', why)
        record_end(job_key, hist_key, false, job_id .. '@' .. first, 0, 'skipped', why)
        redis.call('HSET', job_key, 'gap', gap)
        skipped = skipped + tonumber(count)
      end
      -- A run of this occurrence exists (lua/backfill.lua ran it): it is not run again.
      local ran = fire ~= '0' and redis.call('EXISTS', run_key) == 1
      local held = nil  -- overlap skip / bufferOne: the job's active run, if any
      if not ran and (fire == 's' or fire == 'b' or fire == 'c') then
        local a = redis.call('HMGET', job_key, 'active', 'buffered')
        if a[1] and a[1] ~= '' then
          held = a
          -- The record heals: an active run that has ended (or whose hash is gone) is let go
          -- as its end would have, a buffered run taking its place.
          if active_ended(a[1]) then
            release_active(job_key, retry_key, a[1], now_s, actives[a[1]])
            redis.call('HINCRBY', stats_key, 'overlap_healed', 1)
            held = nil
            if a[2] and a[2] ~= '' then held = {a[2], ''} end
          end
        end
      end
      if ran then
        skipped = skipped + 1
      elseif held then
        if fire ~= 's' and (not held[2] or held[2] == '') then
          redis.call('HSET', run_key, 'attempt', '0', 'state', 'buffered', 'queue', queue,
                     'type', jtype, 'ov', '1', 'v', version)
          buffer_behind(job_key, retry_key, run_id, held[1], fire, now_s)
          last_run = ''  -- it will run: it counts as a run started (maxRuns)
        else
          local why = 'overlap: run ' .. held[1] .. ' of this job is still active'
          if fire ~= 's' then why = why .. ' and ' .. held[2] .. ' waits already' end
          redis.call('HSET', run_key, 'attempt', '0', 'state', 'skipped', 'queue', queue,
                     'type', jtype, 'ended_ms', now_s, 'error', why, 'v', version)
          if run_ttl ~= '0' then redis.call('PEXPIRE', run_key, run_ttl) end
          emit(events_key, maxlen, 'e', 'skipped', 'j', job_id, 'r', run_id, 't', now_s,
               'ty', jtype, 'q', queue, 'err', why)
          record_end(job_key, hist_key, false, run_id, 0, 'skipped', why)
          skipped = skipped + 1
        end
      elseif fire ~= '0' and lkey and not lim_admit(prefix, lkey, run_id, retry_key, now, true) then
        -- Held by its limit (include limits): the run waits, no attempt spent.
        local d = lim_def(prefix, lkey)
        redis.call('HSET', run_key, 'attempt', '0', 'state', 'waiting', 'waiting', d and d.name or '',
                   'queue', queue, 'type', jtype, 'v', version)
        lim_deferred(prefix, d)
        if fire ~= '1' then
          redis.call('HSET', run_key, 'ov', '1')
          redis.call('HSET', job_key, 'active', run_id)
        end
        waiting = waiting + 1
        last_run = run_id
      elseif fire ~= '0' then
        local sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype, 'x', spec)
        used[stream_key] = true
        -- No fence and no worker yet (read as 0 and none); id, job id and scheduled time are
        -- in the run id.
        redis.call('HSET', run_key, 'attempt', '1', 'state', 'dispatched', 'dispatched_ms', now_s,
                   'stream_id', sid, 'queue', queue, 'type', jtype, 'v', version)
        if fire ~= '1' then
          redis.call('HSET', run_key, 'ov', '1')
          redis.call('HSET', job_key, 'active', run_id)
        end
        dispatch_event(run_id, '1', jtype, queue)
        dispatched = dispatched + 1
        last_run = run_id
      elseif gap == '' then
        emit(events_key, maxlen, 'e', 'skipped', 'j', job_id, 'r', run_id, 't', now_s, 's', expected,
             'ty', jtype, 'q', queue, 'err', 'skipped')
        record_end(job_key, hist_key, false, run_id, 0, 'skipped', 'skipped')
        skipped = skipped + 1
      end
      if once then
        -- A one-off job run again (its time changed after its own run): a run of its own.
        unindex[#unindex + 1] = job_id
        redis.call('HSET', job_key, J.next_ms, '0', J.last_run_id, last_run)
      else
        local life = last_run and spec_life(spec)
        if life and life[3] > 0 then
          -- A run started (dispatched or buffered) counts; maxRuns' last one ends the schedule.
          if redis.call('HINCRBY', job_key, 'runs', 1) >= life[3] then next_ms = '0' end
        end
        if next_ms ~= '0' then
          redis.call('ZADD', due_key, next_score, job_id)
        else
          unindex[#unindex + 1] = job_id
          redis.call('HSET', job_key, J.status, 'completed', J.updated_ms, now_s)
        end
        if last_run and last_run ~= '' then
          redis.call('HSET', job_key, J.next_ms, next_ms, J.last_run_id, last_run)
        else
          redis.call('HSET', job_key, J.next_ms, next_ms)
        end
      end
    end
  else
    local due = redis.call('ZSCORE', retry_key, run_id)
    local status, jtype, spec, own_run, job_queue, own_state, own_attempt, cancel, lkey = unpack(
      redis.call('HMGET', job_key, J.status, J.type, J.spec, J.own_run, J.queue, OWN.state,
                 OWN.attempt, 'cancel', J.limit_key))
    if jtype and not status then status = DEFAULT_STATUS end  -- not stored while it is (layout)
    local rkey, F = run_home(run_id, run_key, job_key, own_run)
    local own = F == OWN_RUN
    local state, attempt_s, queue, ov = own_state, own_attempt, job_queue or DEFAULT_QUEUE, nil
    if not own then
      local r = redis.call('HMGET', run_key, 'state', 'attempt', 'queue', 'ov')
      state, attempt_s, queue, ov = r[1], r[2], r[3], r[4]
    end
    local qi = stream_at[queue] or 0
    local stream_key = KEYS[qi]
    if not due or tonumber(due) > now then
      skipped = skipped + 1
    elseif state ~= 'retry_wait' and state ~= 'buffered' and state ~= 'waiting' then
      -- Due, but its run no longer waits for a retry (its hash is gone, or it moved on): a
      -- left-over entry would look due forever and keep the dispatcher from sleeping.
      redis.call('ZREM', retry_key, run_id)
      skipped = skipped + 1
    elseif not stream_key then
      out[#out + 1] = run_id
    else
      redis.call('ZREM', retry_key, run_id)
      -- A run ended here ends the attempt it waited to make: recorded as that attempt.
      local stopped = string.format('%d', tonumber(attempt_s or '0') + 1)
      if not status or status == 'cancelled' then
        redis.call('HSET', rkey, F.state, 'abandoned', F.attempt, stopped, F.ended_ms, now,
                   F.error, 'job cancelled')
        emit(events_key, maxlen, 'e', 'abandoned', 'j', job_id, 'r', run_id, 'a', stopped,
             't', now, 'ty', jtype or '', 'q', queue, 'err', 'job cancelled before the retry ran')
        record_end(job_key, hist_key, own, run_id, stopped, 'abandoned',
                   'job cancelled before the retry ran')
        if ov == '1' then release_active(job_key, retry_key, run_id, now, rkey) end
        if lkey then lim_drop(prefix, lkey, run_id, retry_key, now) end
        skipped = skipped + 1
      elseif cancel == run_id and ov == '1' then  -- overlap cancelPrevious asked it to stop
        redis.call('HSET', rkey, F.state, 'cancelled', F.attempt, stopped, F.ended_ms, now,
                   F.error, STOPPED)
        if run_ttl ~= '0' then redis.call('PEXPIRE', rkey, run_ttl) end
        emit(events_key, maxlen, 'e', 'cancelled', 'j', job_id, 'r', run_id, 'a', stopped,
             't', now, 'ty', jtype or '', 'q', queue, 'err', STOPPED)
        record_end(job_key, hist_key, own, run_id, stopped, 'cancelled', STOPPED)
        release_active(job_key, retry_key, run_id, now, rkey)
        if lkey then lim_drop(prefix, lkey, run_id, retry_key, now) end
        skipped = skipped + 1
      elseif lkey and not lim_admit(prefix, lkey, run_id, retry_key, now, false) then
        -- Held by its limit (include limits): it waits, its attempt count unchanged.
        if state ~= 'waiting' then  -- starts waiting (a waiting run's turn may not have come)
          local d = lim_def(prefix, lkey)
          redis.call('HSET', rkey, F.state, 'waiting', F.waiting, d and d.name or '')
          lim_deferred(prefix, d)
          waiting = waiting + 1
        end
      else
        if state == 'waiting' then redis.call('HDEL', rkey, F.waiting) end
        local attempt = tonumber(attempt_s) + 1
        local sid
        if own then
          sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype, 'a', attempt, 'x', spec,
                           'o', '1', 'd', due)
          redis.call('HSET', job_key, F.attempt, attempt, F.state, 'dispatched', F.worker, '',
                     F.dispatched_ms, now, F.stream_id, sid, J.last_run_id, run_id)
        else
          sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype, 'a', attempt, 'x', spec,
                           'd', due)
          redis.call('HSET', run_key, F.attempt, attempt, F.state, 'dispatched', F.worker, '',
                     F.dispatched_ms, now, F.stream_id, sid)
          redis.call('HSET', job_key, J.last_run_id, run_id)
        end
        used[stream_key] = true
        dispatch_event(run_id, string.format('%d', attempt), jtype, queue)
        dispatched = dispatched + 1
      end
    end
  end
end
for k = 1, #unindex, 1000 do
  redis.call('ZREM', due_key, unpack(unindex, k, math.min(k + 999, #unindex)))
end
if dispatched > 0 then redis.call('HINCRBY', stats_key, 'dispatched', dispatched) end
if waiting > 0 then redis.call('HINCRBY', stats_key, 'limit_deferred', waiting) end
batch_flush(dispatched_events)
lim_index(prefix)

-- Drop entries every worker has acknowledged: everything before the oldest pending entry, or
-- up to the last delivered one when nothing is pending.  Cheaper than an XDEL per run.
for stream_key in pairs(used) do
  trim_acked(stream_key, group)
end

local earliest = ''
local d = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local r = redis.call('ZRANGE', retry_key, 0, 0, 'WITHSCORES')
if d[2] then earliest = tonumber(d[2]) end
if r[2] and (earliest == '' or tonumber(r[2]) < earliest) then earliest = tonumber(r[2]) end
out[1], out[2], out[3] = dispatched, skipped, tostring(earliest)
return out
