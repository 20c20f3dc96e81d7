--[[ claim: move due occurrences and due retries of one partition onto its queue streams.

The dispatcher passes what it read from the due and retry sets (plain reads); this script
re-checks everything against Redis's own clock and the stored state, so the call is safe to
apply twice and a stale dispatcher (old fence) changes nothing.  A one-off job needs nothing
from Python: the script reads it, finds its queue stream among the partition's streams (all of
them are passed, so every key touched is declared) and dispatches it.  A recurring job needs
its next time computed in Python: the first call hands it back in `needs`, the dispatcher
reads it and calls again with kind 'j'.  A job whose queue stream was not passed comes back in
`needs` too (the dispatcher refreshes its list of the partition's queues).

KEYS[1]        rsched:{pN}:lease     HASH   owner, fence, expires_ms
KEYS[2]        rsched:{pN}:due       ZSET   job id -> due score (ms - priority/2048)
KEYS[3]        rsched:{pN}:retry     ZSET   run id -> due ms
KEYS[4]        rsched:{pN}:events    STREAM history
KEYS[5]        rsched:{pN}:stats     HASH   counters
KEYS[5+q]      rsched:{pN}:q:<queue_q>  STREAM, q = 1..nq: every queue of the partition
KEYS[5+nq+2i-1], KEYS[5+nq+2i]  per item: rsched:{pN}:job:<id> HASH, rsched:{pN}:run:<run id> HASH
ARGV[1]  owner        ARGV[2] fence        ARGV[3] now_ms (0 = Redis TIME)
ARGV[4]  events_maxlen (0 = unbounded)      ARGV[5] nq      ARGV[6] n items
ARGV[7]  consumer group of the queue streams (acknowledged entries are trimmed)
then per item 8 values: kind, job id, run id, score, expected, next_ms, next_score, fire
  kind 'o' (an occurrence as read from the due set): score = its due score, expected = the
           job's next_ms it implies (compare-and-set); the rest unused
  kind 'j' (a recurring occurrence, next time computed): score, expected as for 'o';
           next_ms/next_score = the following occurrence and its due score, '0' = none;
           fire '0' = skip this occurrence (misfire policy skip)
  kind 'r' (retry, replay or trigger of a run): score = its due ms in the retry set
Returns {dispatched, skipped, earliest, needs_1, ..., needs_k}
  {-1} when the caller's lease or fence is stale; nothing was written
  earliest: the earliest due score left in the due or retry set ('' when both are empty)
  needs: ids handed back: job ids for a call with kind 'j' (recurring, queue stream not
         passed, or job hash gone), run ids of retries whose queue stream was not passed
]]
--!include util
--!include trim_acked
local lease_key, due_key, retry_key, events_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, fence = ARGV[1], ARGV[2]
local now = now_ms(ARGV[3])
-- Redis 7.0 formats every Lua number passed to redis.call with snprintf: pass strings.
local now_s = string.format('%d', now)
local maxlen, nq, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local group = ARGV[7]

local l = redis.call('HMGET', lease_key, 'owner', 'fence', 'expires_ms')
if l[1] ~= owner or l[2] ~= fence or tonumber(l[3] or '0') <= now then
  return {-1}
end

local stream_at, used = {}, {}  -- queue name -> index of its stream in KEYS
for q = 1, nq do
  local stream_key = KEYS[5 + q]
  stream_at[string.match(stream_key, ':q:(.*)$')] = 5 + q
end

local dispatched, skipped = 0, 0
local out = {0, 0, ''}
local a = 8
local base = 5 + nq
for i = 1, n do
  local kind, job_id, run_id, score = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  local expected, next_ms, next_score, fire = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  a = a + 8
  local job_key, run_key = KEYS[base + 2 * i - 1], KEYS[base + 2 * i]

  if kind ~= 'r' then
    -- Due by Redis's clock, and still the occurrence that was read (compare-and-set on status
    -- and next_ms): a second apply, a paused or rescheduled job all find nothing to do.
    local j = redis.call('HMGET', job_key, 'status', 'next_ms', 'type', 'queue', 'spec', 'cron')
    local once = (not j[6] or j[6] == '')
    local qi = stream_at[j[4]] or 0
    local stream_key = KEYS[qi]
    if kind == 'o' and (not j[1] or not once or not stream_key) then
      out[#out + 1] = job_id  -- recurring, unknown queue, or gone: the dispatcher reads it
    elseif j[1] and j[1] ~= 'scheduled' then
      -- Paused, cancelled or finished: such a job has no place in the due set (the scripts that
      -- change its status remove it); a left-over entry would look due forever.
      redis.call('ZREM', due_key, job_id)
      skipped = skipped + 1
    elseif score > now + 0.5 or j[2] ~= expected or not stream_key then
      skipped = skipped + 1
    else
      local last_run = nil
      if fire ~= '0' then
        local sid = redis.call('XADD', stream_key, '*', 'r', run_id, 'j', job_id, 't', j[3],
                               'a', '1', 's', expected, 'x', j[5])
        used[stream_key] = true
        -- No fence and no worker yet (read as 0 and none); id, job id and scheduled time are
        -- in the run id.  Each field left out saved a few percent of this script.
        redis.call('HSET', run_key, 'attempt', '1', 'state', 'dispatched', 'dispatched_ms', now_s,
                   'stream_id', sid, 'queue', j[4], 'type', j[3], 'once', once and '1' or '0')
        emit(events_key, maxlen, 'e', 'dispatched', 'j', job_id, 'r', run_id, 'a', '1', 't', now_s,
             's', expected, 'ty', j[3], 'q', j[4])
        dispatched = dispatched + 1
        last_run = run_id
      else
        emit(events_key, maxlen, 'e', 'skipped', 'j', job_id, 'r', run_id, 't', now_s, 's', expected,
             'ty', j[3], 'q', j[4], 'err', 'misfire: skipped an occurrence missed by more than the grace period')
        skipped = skipped + 1
      end
      if once then
        redis.call('ZREM', due_key, job_id)
        -- A one-off job's own run: its final attempt is read back from the run hash.
        redis.call('HSET', job_key, 'next_ms', '0', 'last_run_id', last_run, 'own_run', last_run)
      else
        if next_ms ~= '0' then
          redis.call('ZADD', due_key, next_score, job_id)
        else
          redis.call('ZREM', due_key, job_id)
        end
        if last_run then
          redis.call('HSET', job_key, 'next_ms', next_ms, 'last_run_id', last_run)
        else
          redis.call('HSET', job_key, 'next_ms', next_ms)
        end
      end
    end
  else
    local due = redis.call('ZSCORE', retry_key, run_id)
    local r = redis.call('HMGET', run_key, 'state', 'attempt', 'queue')
    r[4] = string.match(run_id, '@(%d+)$')
    local qi = stream_at[r[3]] or 0
    local stream_key = KEYS[qi]
    if not due or tonumber(due) > now or r[1] ~= 'retry_wait' then
      skipped = skipped + 1
    elseif not stream_key then
      out[#out + 1] = run_id
    else
      redis.call('ZREM', retry_key, run_id)
      local j = redis.call('HMGET', job_key, 'status', 'type', 'spec')
      if not j[1] or j[1] == 'cancelled' then
        redis.call('HSET', run_key, 'state', 'abandoned', 'ended_ms', now, 'error', 'job cancelled')
        emit(events_key, maxlen, 'e', 'abandoned', 'j', job_id, 'r', run_id, 'a', r[2], 't', now,
             'ty', j[2] or '', 'q', r[3], 'err', 'job cancelled before the retry ran')
        skipped = skipped + 1
      else
        local attempt = tonumber(r[2]) + 1
        local sid = redis.call('XADD', stream_key, '*', 'r', run_id, 'j', job_id, 't', j[2],
                               'a', attempt, 's', r[4], 'x', j[3])
        used[stream_key] = true
        redis.call('HSET', run_key, 'attempt', attempt, 'state', 'dispatched', 'worker', '',
                   'dispatched_ms', now, 'stream_id', sid)
        redis.call('HSET', job_key, 'last_run_id', run_id)
        emit(events_key, maxlen, 'e', 'dispatched', 'j', job_id, 'r', run_id, 'a', attempt, 't', now,
             's', r[4], 'ty', j[2], 'q', r[3])
        dispatched = dispatched + 1
      end
    end
  end
end
if dispatched > 0 then redis.call('HINCRBY', stats_key, 'dispatched', dispatched) end

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
