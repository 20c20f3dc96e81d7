--[[ schedule: create jobs of one partition; each job atomically, idempotent on its id.

The jobs of a call store the same hash fields, so their names travel once per call; the values
the jobs of a batch mostly share (type, queue, status, ...) travel once per group of jobs that
share them, and each job carries only its own: a third of the arguments a job once took, for
Redis to parse and the client to pack.

A one-off job created due (score <= now) in a group that names its queue stream goes straight
to that stream, as claim.lua's dispatch_own would send it a moment later: the same stream entry
(r, t, x, o; and d, now, for one whose runAt lies more than a second in the past: start lag counts
from its creation, not from a time before it existed), run fields (OWN.* in the job hash, next_ms 0) and 'dispatched' event, without a
due-set entry and a dispatcher round trip.  Jobs due later, recurring or paused ones keep the
due set (the dispatcher applies overlap and catch-up to recurring jobs), as does a job past its
start deadline already (claim.lua dead-letters it).

KEYS[1]     rsched:{pN}:due           ZSET   job id -> due score
KEYS[2]     rsched:{pN}:events        STREAM history
KEYS[3]     rsched:{pN}:queues        SET    queue names in use
KEYS[4]     rsched:{pN}:stats         HASH   counters (dispatched)
KEYS[4+i]   rsched:{pN}:job:<id_i>    HASH   one per job, in ARGV order
KEYS[4+n+s] rsched:{pN}:q:<queue>     STREAM the queue streams the groups name, s = 1..
then, in a dedup call, the keys its jobs' dedup arguments name by index:
            rsched:{pN}:dedup:<hash>  STRING the id of the job a dedup key answers with
            rsched:{pN}:job:<id>      HASH   a job a record named when the caller last called
ARGV[1]     now_ms (0 = Redis TIME)
ARGV[2]     events_maxlen (0 = unbounded)
ARGV[3]     consumer group of the queue streams (acknowledged entries are trimmed)
ARGV[4]     due_ms: the caller's estimate of Redis's clock when it computed the jobs' times; a
            job due by it (created without a runAt, or one in the past) goes straight to its
            queue even when Redis's clock reads a millisecond or two earlier
ARGV[5]     n, the number of jobs
ARGV[6]     ns, the number of shared job-hash fields; the first two are type and queue
ARGV[7]     no, the number of a job's own job-hash fields: 2, next_ms and spec (the only layout
            the client sends; anything else is refused)
ARGV[8]     keyed: 1 if every job of the call carries a body_hash (keyed ids), 0 if none does
            (random ids, which only a replay of this very call can find existing)
ARGV[9]     dedup: 1 if every job of the call carries a dedup window, 0 if none does
ARGV[10..9+ns+no]  the shared field names, then the own field names
then groups until n jobs are read; a group: count, stream (index in KEYS of the group's queue
  stream, 0 = none: never straight to the queue, e.g. recurring), scored (0: its jobs are not
  indexed, e.g. created paused; 1: each is due at its next_ms, the first own value; 2: each
  carries its due score; a group of jobs with a limit key, J.limit_key, names no stream: its
  limit is applied by claim.lua), its ns shared values ('' = not stored, e.g. a one-off job's
  cron),
  then count jobs, each: its dedup window (dedup calls only: see below), its body_hash (keyed
  calls only), its score (scored 2 only), its id (the key holds it, the hash does not), its no
  own values
A job's dedup window: the KEYS index of its record, its mode (ttl, untilDone, debounce), its
  ttl_ms, the KEYS index of the job its record named when the caller last called (0: none)
  and that job's id ('').  A job found existing (its id: an idempotent replay) is answered as
  before; else a record naming a job that still holds the window answers that job: ttl, while
  its hash exists; untilDone, while it exists and is neither completed, dead nor cancelled;
  debounce, while it waits in the due set, and then the job takes this create's next_ms,
  score and spec, the record's ttl starts again and an 'updated' event says so.  Else the job
  is created and its record set to it with PX ttl_ms.  The record's job must be one the call names (the caller's guess
  or a job created earlier in the call: one slot, and a script touches only its KEYS); a
  record naming another answers code 4 and the caller calls again with it.
Stores per job (under the names of include layout, J): the shared fields not '' and not
their default (queue DEFAULT_QUEUE, status DEFAULT_STATUS: the readers fill them in), the no
own fields, and for a job with a body_hash (a keyed id) body_hash and created_ms (now_ms; a
random id's stamp holds the client's reading of it: rsched.core.ids.created_ms_of).  The call's
'scheduled' events share one events-stream entry, its 'dispatched' ones another (batch_flush in
util).
Returns {head, now_ms, code_1, ..., code_n}
  head    1 if a job created here is now the partition's earliest due job (wake a dispatcher)
  now_ms  the time the script stamped on created jobs with a body_hash (their created_ms)
  code_i  0 created, 1 already exists with the same body_hash (idempotent replay),
          2 exists with another body_hash (conflict), 3 answered by the job its dedup record
          names, 4 its dedup record names a job the call did not name (call again with it)
  then, after the n codes, the id of the job each code 3 or 4 is about, in order
]]
--!include layout
--!include util
--!include trim_acked
--!include life
-- Locals, not globals: the loop below reads ARGV and KEYS ~5 times a job (a global is a hash
-- lookup each time).
local ARGV, KEYS = ARGV, KEYS
local due_key, events_key, queues_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms(ARGV[1])
local maxlen = tonumber(ARGV[2])
local group = ARGV[3]
local due_cut = math.max(tonumber(ARGV[4]), now) + 0.5
local n = tonumber(ARGV[5])
local ns, no = tonumber(ARGV[6]), tonumber(ARGV[7])
if no ~= 2 then
  return redis.error_reply('schedule: a job has 2 own fields (next_ms, spec), not ' .. ARGV[7])
end
local keyed = ARGV[8] == '1'
local dedup = ARGV[9] == '1'
local NAMES = 9  -- ARGV[NAMES + k]: the k-th field name
-- The time as a string once: Redis formats a Lua number argument with snprintf on every call,
-- twice a job here (created_ms, the event's t).
local now_s = string.format('%d', now)
-- HSET arguments, reused for every job of a group: names fixed, values refilled (set_group).
local fields = {}
local NEXT_MS  -- where next_ms's value is in fields (own field 1)
local last  -- the run fields of a job sent to its queue go after the hash fields
local RUN_FIELDS = 10  -- their names and values
local out = {0, now}
local earliest = nil
-- One ZADD for the call's jobs, not one per job, flushed below Lua's unpack limit.
local due, nd = {}, 0  -- nd: its length, counted (# is a search in Lua 5.1)
local function flush_due()
  if nd > 0 then redis.call('ZADD', due_key, unpack(due, 1, nd)) end
  due, nd = {}, 0
end
local a = NAMES + 1 + ns + no  -- the first group
-- The call's jobs mostly share one type and queue (a batch of one kind): then its events
-- carry them once, among the fields every event of the entry shares, rather than as columns
-- filled per job and compared at the flush.
local one_kind = true
do
  local g, seen = a, 0
  local t1, q1 = ARGV[a + 3], ARGV[a + 4]
  while seen < n do
    local count = tonumber(ARGV[g])
    if ARGV[g + 3] ~= t1 or ARGV[g + 4] ~= q1 then
      one_kind = false
      break
    end
    local per = 1 + no + (keyed and 1 or 0) + (ARGV[g + 2] == '2' and 1 or 0)
                + (dedup and 5 or 0)
    seen, g = seen + count, g + 3 + ns + count * per
  end
end
-- The call's 'scheduled' events share one events-stream entry (batch_new in util), its
-- 'dispatched' ones (jobs sent straight to their queue, as claim.lua's dispatch_own does: see
-- the header) another.
local scheduled, dispatched
if one_kind then
  local kind = {'ty', ARGV[a + 3], 'q', ARGV[a + 4]}
  scheduled = batch_new(events_key, maxlen, {'e', 'scheduled', 't', now_s, unpack(kind)}, {'j'})
  dispatched = batch_new(events_key, maxlen,
                         {'e', 'dispatched', 't', now_s, 'a', '1', unpack(kind)}, {'r'})
else
  scheduled = batch_new(events_key, maxlen, {'e', 'scheduled', 't', now_s}, {'j', 'ty', 'q'})
  dispatched = batch_new(events_key, maxlen, {'e', 'dispatched', 't', now_s, 'a', '1'},
                         {'r', 'ty', 'q'})
end
local sent = 0
local used = {}  -- queue streams written: trimmed below the acknowledged entries at the end
-- Shared fields left out when they hold their default (a field costs a job hash its name's and
-- value's bytes plus 4: 12 for queue 'default', 14 for status 'scheduled').
local LEFT_OUT = {[J.queue] = DEFAULT_QUEUE, [J.status] = DEFAULT_STATUS}
-- A group's HSET arguments: created_ms (sent for keyed ids only: unpack(fields, 3) leaves it
-- out), its shared fields but those it leaves '' (an empty field costs a job hash ~8 bytes) or
-- at their default, then the own field names, their values filled per job.
local function set_group(at)
  fields = {J.created_ms, now_s}
  for k = 1, ns do
    local name, v = ARGV[NAMES + k], ARGV[at + k]
    if v ~= '' and LEFT_OUT[name] ~= v then fields[#fields + 1], fields[#fields + 2] = name, v end
  end
  NEXT_MS = #fields + 2
  for k = 1, no do fields[#fields + 1], fields[#fields + 2] = ARGV[NAMES + ns + k], '' end
  last = #fields
  -- A job sent straight to its queue also gets its run's fields (claim.lua's dispatch_own; no
  -- last_run_id: absent, it is the own run); the run id and stream id are filled in per job.
  local run = {J.own_run, '', OWN.attempt, '1', OWN.state, 'dispatched',
               OWN.dispatched_ms, now_s, OWN.stream_id, ''}
  for k = 1, RUN_FIELDS do fields[last + k] = run[k] end
end
local i = 0
local byte = string.byte
local score_text, score_n = nil, nil  -- the last score seen, parsed
-- One EXISTS over the call's job keys: in the usual call none exists, which spares a call per
-- job; else each job is looked up.  A key repeated in
-- a keyed call (an idempotency key given twice) is found in `made`: job key -> its body_hash.
local made = {}
local any_exists = false
-- Dedup calls: the KEYS index of each job created by the call (a later job's record may name
-- it), and the ids of the jobs codes 3 and 4 are about.
local made_at, about = {}, {}
-- Whether the job a dedup record names still holds its window (the header says when).
local function holds(mode, held_key, held)
  if mode == 'debounce' then
    flush_due()  -- it may be a job of this call
    return redis.call('ZSCORE', due_key, held) ~= false
  end
  local j = redis.call('HMGET', held_key, J.type, J.status)
  if not j[1] then return false end  -- gone: a finished job's hash expires
  local status = j[2] or DEFAULT_STATUS
  return mode == 'ttl' or (status ~= 'completed' and status ~= 'dead' and status ~= 'cancelled')
end
for c = 5, 4 + n, 1000 do
  any_exists = any_exists or redis.call('EXISTS', unpack(KEYS, c, math.min(c + 999, 4 + n))) > 0
end
while i < n do
  local count, stream, scored = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
  local jtype, queue = ARGV[a + 3], ARGV[a + 4]
  local stream_key = KEYS[stream]  -- nil for 0
  set_group(a + 2)
  a = a + 3 + ns
  redis.call('SADD', queues_key, queue)
  local own_score, indexed = scored == '2', scored ~= '0'
  for _ = 1, count do
    i = i + 1
    local body_hash, score = '', nil
    local rec_at, mode, ttl, guess_at, guess
    if dedup then
      rec_at, mode, ttl = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2]
      guess_at, guess, a = tonumber(ARGV[a + 3]), ARGV[a + 4], a + 5
    end
    if keyed then
      body_hash, a = ARGV[a], a + 1
    end
    if own_score then
      score, a = ARGV[a], a + 1
    end
    local id = ARGV[a]
    fields[NEXT_MS], fields[NEXT_MS + 2] = ARGV[a + 1], ARGV[a + 2]  -- next_ms, spec: no loop
    a = a + 1 + no
    local job_key = KEYS[4 + i]
    local existing = false
    if not any_exists then  -- none existed before the call: only one created by it can (a
      existing = keyed and made[job_key] or false  -- random id is never drawn twice)
    elseif not keyed then
      existing = redis.call('EXISTS', job_key) == 1 and ''
    else
      existing = redis.call('HGET', job_key, J.body_hash)
    end
    if dedup and not existing then
      local rec_key = KEYS[rec_at]
      local held = redis.call('GET', rec_key)
      if held then
        -- KEYS index of the job that answers for this one, if the call names it
        local held_at = made_at[held] or (held == guess and guess_at > 0 and guess_at) or nil
        if not held_at then
          out[i + 2], about[#about + 1] = 4, held
          existing = true
        else
          local held_key = KEYS[held_at]
          if holds(mode, held_key, held) then
            if mode == 'debounce' then  -- moved, as update.lua changes a job: 'updated'
              local j = redis.call('HMGET', held_key, J.type, 'version')
              redis.call('HSET', held_key, J.next_ms, fields[NEXT_MS], J.spec, fields[NEXT_MS + 2],
                         J.updated_ms, now_s, 'version', tonumber(j[2] or '1') + 1)
              redis.call('ZADD', due_key, own_score and score or fields[NEXT_MS], held)
              redis.call('PEXPIRE', rec_key, ttl)
              batch_flush(scheduled)  -- after the job's 'scheduled', when this call made it
              emit(events_key, maxlen, 'e', 'updated', 'j', held, 't', now_s, 'ty', j[1])
            end
            out[i + 2], about[#about + 1] = 3, held
            existing = true
          end
        end
      end
    end
    if existing == true then  -- answered by a dedup record (code 3 or 4 above)
    elseif existing then
      out[i + 2] = (existing == body_hash) and 1 or 2
    else
      if indexed and not own_score then score = fields[NEXT_MS] end
      -- Parsed once per distinct text (tonumber is a strtod; the jobs of a call mostly share
      -- their due ms, and Lua compares its strings by reference).
      if score ~= score_text then score_text, score_n = score, score and tonumber(score) end
      local s = score_n
      local direct = stream_key and s and s <= due_cut
      -- Past its start deadline already: the due set, where claim dead-letters it (spec_life's
      -- own first test, without its call per job).
      if direct and byte(fields[NEXT_MS + 2], 1) == SPEC_WITH_LIFE then
        local life = spec_life(fields[NEXT_MS + 2])
        if life and life[4] > 0 and now > tonumber(fields[NEXT_MS]) + life[4] then direct = false end
      end
      if direct then
        local run_id = id .. '@' .. fields[NEXT_MS]
        local sid
        if s < now - 1000 then
          sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype,
                           'x', fields[NEXT_MS + 2], 'o', '1', 'd', now_s)
        else
          sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype,
                           'x', fields[NEXT_MS + 2], 'o', '1')
        end
        used[stream_key] = true
        fields[NEXT_MS] = '0'
        fields[last + 2], fields[last + 10] = run_id, sid
        direct = run_id
      end
      -- The run fields after `last` are sent for a job sent to its queue only.
      local stop = direct and last + RUN_FIELDS or last
      if not keyed then
        redis.call('HSET', job_key, unpack(fields, 3, stop))
      else
        redis.call('HSET', job_key, J.body_hash, body_hash, unpack(fields, 1, stop))
      end
      if not direct and s then
        due[nd + 1], due[nd + 2] = score, id
        nd = nd + 2
        if nd >= 2000 then flush_due() end
        if not earliest or s < earliest then earliest = s end
      end
      local k = batch_slot(scheduled)
      scheduled[1][k] = id
      if not one_kind then scheduled[2][k], scheduled[3][k] = jtype, queue end
      if direct then  -- a job's 'dispatched' event is never written before its 'scheduled'
        if dispatched.n >= BATCH_MAX then batch_flush(scheduled) end
        k = batch_slot(dispatched)
        dispatched[1][k] = direct
        if not one_kind then dispatched[2][k], dispatched[3][k] = jtype, queue end
        sent = sent + 1
      end
      if keyed and not any_exists then made[job_key] = body_hash end
      if dedup then
        local rec_key = KEYS[rec_at]
        redis.call('SET', rec_key, id, 'PX', ttl)
        made_at[id] = 4 + i
      end
      out[i + 2] = 0
    end
  end
end
flush_due()
batch_flush(scheduled)
batch_flush(dispatched)
if sent > 0 then redis.call('HINCRBY', stats_key, 'dispatched', sent) end
for stream_key in pairs(used) do
  trim_acked(stream_key, group)
end
if earliest then
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) >= earliest then out[1] = 1 end
end
for k = 1, #about do out[n + 2 + k] = about[k] end
return out
