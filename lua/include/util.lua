-- Shared helpers, inlined into every script that says `--!include util`.

-- Redis's own clock unless the caller injects one (tests): one clock for every dispatcher.
local function now_ms(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Append one history event; maxlen 0 keeps everything until the archiver trims it.
local function emit(key, maxlen, ...)
  if maxlen > 0 then
    return redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', ...)
  end
  return redis.call('XADD', key, '*', ...)
end

-- Events of one kind from one script call, appended as one stream entry (an XADD per run cost
-- about a tenth of Redis's time per run).  The entry holds 'n' (how many events, when more
-- than one: a single event is a plain entry), the fields
-- every event shares once, and one field per column whose values differ: the events' values
-- joined by '\n', '' for an event without one.  Event k (1..n) of entry <ms>-<seq> is event
-- <ms>-<seq+k-1>: XSETID reserves those ids, so later entries never reuse them and the archive
-- keys every event by an id of its own (rsched.archive.events.expand reads the entry back).
-- Callers put in a batch only values that cannot hold '\n' (ids, names, numbers, JSON).  An
-- entry holds at most BATCH_MAX events, which bounds what one archiver read holds
-- (rsched.archive.events.EVENTS_PER_ENTRY_MAX).
-- key, maxlen: the events stream (see emit); common: the field/value pairs every event shares;
-- columns: the names of the fields whose values are per event, set as b[c][k] (see batch_slot).
-- size (optional): how many events the caller may add; the columns are made that long at once
-- (up to BATCH_MAX) with placeholders (ARGV's values, which a slot overwrites before a flush
-- reads it), rather than 8 columns grown one event at a time.
local BATCH_MAX = 100
local function batch_new(key, maxlen, common, columns, size)
  local b = {n = 0, key = key, maxlen = maxlen, common = common, names = columns}
  size = math.min(size or 0, BATCH_MAX)
  for c = 1, #columns do b[c] = {unpack(ARGV, 1, size)} end
  return b
end

-- Append the batch's entry (nothing when empty) and empty the batch.
local function batch_flush(b)
  local n = b.n
  if n == 0 then return end
  b.n = 0
  -- The entry's field/value pairs; na: how many (a count, not #args twice a field).
  local args = {unpack(b.common)}
  local na, names = #args, b.names
  if n > 1 then args[na + 1], args[na + 2], na = 'n', tostring(n), na + 2 end
  for c = 1, #names do
    local col = b[c]
    local first, same = col[1], true
    for k = 2, n do
      if col[k] ~= first then
        same = false
        break
      end
    end
    if not same then
      args[na + 1], args[na + 2], na = names[c], table.concat(col, '\n', 1, n), na + 2
    elseif first ~= '' then
      args[na + 1], args[na + 2], na = names[c], first, na + 2
    end
  end
  local key = b.key  -- the events stream the caller passed in KEYS
  local sid = emit(key, b.maxlen, unpack(args))
  if n > 1 then
    local ms, seq = string.match(sid, '^(%d+)-(%d+)$')
    redis.call('XSETID', key, ms .. '-' .. string.format('%d', tonumber(seq) + n - 1))
  end
end

-- The index k of one more event (the caller then sets b[c][k] for every column c); appends the
-- batch's entry first when it is full.
local function batch_slot(b)
  if b.n >= BATCH_MAX then batch_flush(b) end
  local k = b.n + 1
  b.n = k
  return k
end

-- Record a finished attempt.  A one-off job's own run (a few attempts at most) keeps its records
-- as 'h:<stream id>:<attempt>' fields of the job hash: creating a list key per job cost a third
-- of the complete script.  Other runs go to the job's bounded history list.
local function remember(job_key, hist_key, len, own, sid, rec)
  if own then
    redis.call('HSET', job_key, 'h:' .. sid .. ':' .. rec.attempt, cjson.encode(rec))
  elseif len > 0 then
    -- Trimmed only once longer than len (LPUSH says how long it is).
    if redis.call('LPUSH', hist_key, cjson.encode(rec)) > len then
      redis.call('LTRIM', hist_key, 0, len - 1)
    end
  end
end

-- A one-off job whose only regular occurrence was dispatched (next_ms 0) ends with its run,
-- even if paused meanwhile; a trigger's run before that occurrence does not end the job.
-- one_off_ends: the rule on the job's status, cron and next_ms as read (HMGET), for callers
-- that read them with other fields.
local function one_off_ends(status, cron, next_ms)
  status = status or DEFAULT_STATUS  -- not stored while scheduled (layout)
  return (status == 'scheduled' or status == 'paused') and (not cron or cron == '')
    and (not next_ms or next_ms == '0')
end
local function one_off_done(job_key)
  local j = redis.call('HMGET', job_key, J.status, J.cron, J.next_ms)
  return one_off_ends(j[1], j[2], j[3])
end

-- Where a run's fields live.  A one-off job's own run (the job's `own_run`) keeps them in the job
-- hash, under OWN's names (include layout): one key fewer to write, read and expire on the
-- hottest path (a one-off job run once), and one HMGET/HSET instead of two.  Every other run has a hash of its own.
-- Callers pass the job key in place of the run key for an own run; its type and queue are the
-- job's.
-- Each table is built on its first use in a call (run_names), not both in every call of every
-- script.  Comparing a run's F with OWN_RUN or PLAIN_RUN still
-- tells them apart: F came from run_names, which built its table, and one not built is nil.
local PLAIN_RUN, OWN_RUN
local function run_names(own)
  if own then
    OWN_RUN = OWN_RUN or {state = OWN.state, attempt = OWN.attempt, fence = OWN.fence,
      worker = OWN.worker, stream_id = OWN.stream_id, dispatched_ms = OWN.dispatched_ms,
      started_ms = OWN.started_ms, ended_ms = OWN.ended_ms, duration_ms = OWN.duration_ms,
      result = OWN.result, error = OWN.error, hb_ms = OWN.hb_ms, waiting = OWN.waiting,
      type = J.type, queue = J.queue}
    return OWN_RUN
  end
  PLAIN_RUN = PLAIN_RUN or {state = 'state', attempt = 'attempt', fence = 'fence',
    worker = 'worker', stream_id = 'stream_id', dispatched_ms = 'dispatched_ms',
    started_ms = 'started_ms', ended_ms = 'ended_ms', duration_ms = 'duration_ms',
    result = 'result', error = 'error', hb_ms = 'hb_ms', waiting = 'waiting', type = 'type',
    queue = 'queue'}
  return PLAIN_RUN
end
local function run_fields(run_key, job_key)
  if run_key == job_key then return OWN_RUN or run_names(true) end
  return PLAIN_RUN or run_names(false)
end

-- Where run `run_id` lives when the caller cannot tell (retry, replay): given the job's own_run
-- as read, the key and field names to use.  Same rule as models.run_fields in Python.
local function run_home(run_id, run_key, job_key, own_run)
  if own_run == run_id then return job_key, run_names(true) end
  return run_key, run_names(false)
end
