--[[ schedule: create jobs of one partition; each job atomically, idempotent on its id.

The jobs of a call store the same hash fields, so their names travel once per call; the values
the jobs of a batch mostly share (type, queue, status, ...) travel once per group of jobs that
share them, and each job carries only its own: a third of the arguments a job once took, for
Redis to parse and the client to pack.

A one-off job created due (score <= now) in a group that names its queue stream goes straight
to that stream, as claim.lua's dispatch_own would send it a moment later: the same stream entry
(r, t, a, x, o), run fields (OWN.* in the job hash, next_ms 0) and 'dispatched' event, without a
due-set entry and a dispatcher round trip.  Jobs due later, recurring or paused ones keep the
due set (the dispatcher applies overlap and catch-up to recurring jobs), as does a job past its
start deadline already (claim.lua dead-letters it).

KEYS[1]     rsched:{pN}:due           ZSET   job id -> due score
KEYS[2]     rsched:{pN}:events        STREAM history
KEYS[3]     rsched:{pN}:queues        SET    queue names in use
KEYS[4]     rsched:{pN}:stats         HASH   counters (dispatched)
KEYS[4+i]   rsched:{pN}:job:<id_i>    HASH   one per job, in ARGV order
KEYS[4+n+s] rsched:{pN}:q:<queue>     STREAM the queue streams the groups name, s = 1..
ARGV[1]     now_ms (0 = Redis TIME)
ARGV[2]     events_maxlen (0 = unbounded)
ARGV[3]     consumer group of the queue streams (acknowledged entries are trimmed)
ARGV[4]     due_ms: the caller's estimate of Redis's clock when it computed the jobs' times; a
            job due by it (created without a runAt, or one in the past) goes straight to its
            queue even when Redis's clock reads a millisecond or two earlier
ARGV[5]     n, the number of jobs
ARGV[6]     ns, the number of shared job-hash fields; the first two are type and queue
ARGV[7]     no, the number of a job's own job-hash fields: next_ms, spec
ARGV[8..7+ns+no]  the shared field names, then the own field names
then groups until n jobs are read; a group: count, stream (index in KEYS of the group's queue
  stream, 0 = none: never straight to the queue, e.g. recurring), its ns shared values ('' =
  not stored, e.g. a one-off job's cron), then count jobs, each: body_hash ('' = none: a job
  with a random id, which only a replay of this very call can find existing), score (due
  score; '' = not indexed, e.g. created paused), id (the job id: the key holds it, the hash
  does not), its no own values
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
          2 exists with another body_hash (conflict)
]]
--!include layout
--!include util
--!include trim_acked
--!include life
local due_key, events_key, queues_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms(ARGV[1])
local maxlen = tonumber(ARGV[2])
local group = ARGV[3]
local due_cut = math.max(tonumber(ARGV[4]), now) + 0.5
local n = tonumber(ARGV[5])
local ns, no = tonumber(ARGV[6]), tonumber(ARGV[7])
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
-- One ZADD for the call's jobs (a call per job cost ~1 us each), flushed below Lua's
-- unpack limit.
local due = {}
local function flush_due()
  if #due > 0 then redis.call('ZADD', due_key, unpack(due)) end
  due = {}
end
-- The call's 'scheduled' events share one events-stream entry (batch_new in util).
local scheduled = batch_new(events_key, maxlen, {'e', 'scheduled', 't', now_s}, {'j', 'ty', 'q'})
-- Jobs sent straight to their queue, as claim.lua's dispatch_own does (see the header).
local dispatched = batch_new(events_key, maxlen, {'e', 'dispatched', 't', now_s},
                             {'r', 'a', 'ty', 'q'})
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
    local name, v = ARGV[7 + k], ARGV[at + k]
    if v ~= '' and LEFT_OUT[name] ~= v then fields[#fields + 1], fields[#fields + 2] = name, v end
  end
  NEXT_MS = #fields + 2
  for k = 1, no do fields[#fields + 1], fields[#fields + 2] = ARGV[7 + ns + k], '' end
  last = #fields
  -- A job sent straight to its queue also gets its run's fields (claim.lua's dispatch_own; no
  -- last_run_id: absent, it is the own run); the run id and stream id are filled in per job.
  local run = {J.own_run, '', OWN.attempt, '1', OWN.state, 'dispatched',
               OWN.dispatched_ms, now_s, OWN.stream_id, ''}
  for k = 1, RUN_FIELDS do fields[last + k] = run[k] end
end
local a = 8 + ns + no
local i = 0
-- One EXISTS over the call's job keys: in the usual call none exists, which spares a call per
-- job (0.8 us of EXISTS, more of redis.call); else each job is looked up.  A key repeated in
-- the call (an idempotency key given twice) is found in `made`: job key -> its body_hash.
local made = {}
local any_exists = false
for c = 5, 4 + n, 1000 do
  any_exists = any_exists or redis.call('EXISTS', unpack(KEYS, c, math.min(c + 999, 4 + n))) > 0
end
while i < n do
  local count, stream = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local jtype, queue = ARGV[a + 2], ARGV[a + 3]
  local stream_key = KEYS[stream]  -- nil for 0
  set_group(a + 1)
  a = a + 2 + ns
  redis.call('SADD', queues_key, queue)
  for _ = 1, count do
    i = i + 1
    local body_hash, score, id = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    for k = 1, no do fields[NEXT_MS - 2 + 2 * k] = ARGV[a + 2 + k] end
    a = a + 3 + no
    local job_key = KEYS[4 + i]
    local existing = false
    if not any_exists then  -- none existed before the call: only one created by it can
      existing = made[job_key] or false
    elseif body_hash == '' then
      existing = redis.call('EXISTS', job_key) == 1 and ''
    else
      existing = redis.call('HGET', job_key, J.body_hash)
    end
    if existing then
      out[i + 2] = (existing == body_hash) and 1 or 2
    else
      local s = score ~= '' and tonumber(score)  -- parsed once (tonumber is a strtod)
      local direct = stream_key and s and s <= due_cut
      if direct then  -- past its start deadline already: the due set, where claim dead-letters it
        local life = spec_life(fields[NEXT_MS + 2])
        if life and life[4] > 0 and now > tonumber(fields[NEXT_MS]) + life[4] then direct = false end
      end
      if direct then
        local run_id = id .. '@' .. fields[NEXT_MS]
        local sid = redis.call('XADD', stream_key, '*', 'r', run_id, 't', jtype,
                               'x', fields[NEXT_MS + 2], 'o', '1')
        used[stream_key] = true
        fields[NEXT_MS] = '0'
        fields[last + 2], fields[last + 10] = run_id, sid
        direct = run_id
      end
      -- The run fields after `last` are sent for a job sent to its queue only.
      local stop = direct and last + RUN_FIELDS or last
      if body_hash == '' then
        redis.call('HSET', job_key, unpack(fields, 3, stop))
      else
        redis.call('HSET', job_key, J.body_hash, body_hash, unpack(fields, 1, stop))
      end
      if not direct and s then
        due[#due + 1] = score
        due[#due + 1] = id
        if #due >= 2000 then flush_due() end
        if not earliest or s < earliest then earliest = s end
      end
      local k = batch_slot(scheduled)
      scheduled[1][k], scheduled[2][k], scheduled[3][k] = id, jtype, queue
      if direct then  -- a job's 'dispatched' event is never written before its 'scheduled'
        if dispatched.n >= BATCH_MAX then batch_flush(scheduled) end
        k = batch_slot(dispatched)
        dispatched[1][k], dispatched[2][k], dispatched[3][k], dispatched[4][k] =
          direct, '1', jtype, queue
        sent = sent + 1
      end
      if not any_exists then made[job_key] = body_hash end
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
return out
