--[[ queue_permit: take, keep and give back permits of one queue's limit (docs/limits.md).

A queue's jobs are spread over every partition, so a queue-wide cap cannot be checked where
runs are dispatched (one partition a script).  It lives on a slot of its own, and a worker
holds one of its permits while a handler of the queue runs: taken before the handler starts,
kept alive by the worker's heartbeat, given back when the handler returns.  A permit is the
member '<run id> <worker id>' with an expiry (ARGV[2] after its last take or keep): a dead
worker's permits expire (its handlers ran no further), and a worker that lost its run to a
reclaim holds another member than the new attempt's, so it can neither keep nor free that one.
The permits and reservations counted in KEYS[2] never exceed the concurrency: a take is granted
only below it.
Runs refused for the concurrency wait in KEYS[4] in the order of their scheduled times (their
workers put them back in their partition's retry set, no attempt spent, with a recheck delay):
a give (or any call that finds room while runs wait) reserves a permit for the earliest waiting
runs ('> <run id>', expiring after ARGV[3]) and returns them, for the caller to make them due
now (lua/queue_wake.lua); a fresh run is refused while runs wait, so they start in order.  A
run refused for the rate is not queued there: it is told when to ask again, its turn among the
runs already told (KEYS[5]): when the start it would replace leaves the window, one period
later for each `rate` of them ahead, so a backlog asks about once a run, not once a run per
window; an entry not back ARGV[3] after its time is dropped.

KEYS[1] rsched:{ql:<queue>}:qlim   STRING  the definition, 'concurrency rate period_ms' (0 = none);
                                           absent: the queue is not limited (every take granted)
KEYS[2] rsched:{ql:<queue>}:qheld  ZSET    permit or reservation -> expires ms
KEYS[3] rsched:{ql:<queue>}:qlog   ZSET    '<run id> <ms>' -> start ms: the rate's sliding window
KEYS[4] rsched:{ql:<queue>}:qwait  ZSET    '<partition> <run id>' -> scheduled ms: waiting runs
KEYS[5] rsched:{ql:<queue>}:qrate  ZSET    run id -> ms it was told to ask again (rate waits)
ARGV[1] now_ms (0 = Redis TIME)   ARGV[2] permit ttl ms   ARGV[3] reservation ttl ms
ARGV[4] recheck ms for the first waiting runs   ARGV[5] recheck ms for the later ones
then 4 values an operation: op, run id, worker id, partition
  op 't' take: 0 granted (or held already), else the ms the run waits before it asks again
     (a concurrency wait: ARGV[4] for the runs among the first 2 x concurrency waiting, ARGV[5]
     up to 20 x concurrency, 10 x ARGV[5] after them, each woken earlier by a give once it is
     the earliest; a rate wait: its turn, see above)
  op 'k' keep: 1 kept, 0 the permit is gone (expired: the worker stalled past its ttl)
  op 'g' give: 1 given back, 0 it was not held
  op 'p' (run id, worker id and partition '') reserve for waiting runs while there is room: 0
Returns {result_1, ..., result_n, wake_1, ...}: a result per operation, then the waiting runs
  given a reservation, '<partition> <run id>' each
]]
--!include util
local def_key, held_key, log_key, wait_key, rate_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms(ARGV[1])
local ttl, reserve_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local recheck_first, recheck_later = tonumber(ARGV[4]), tonumber(ARGV[5])
local conc, rate, period = 0, 0, 0
local packed = redis.call('GET', def_key)
if packed then
  local c, r, p = string.match(packed, '^(%d+) (%d+) (%d+)$')
  conc, rate, period = tonumber(c), tonumber(r), tonumber(p)
end
redis.call('ZREMRANGEBYSCORE', held_key, '-inf', now)  -- expired permits and reservations
local out, wake = {}, {}

local function room()
  return conc == 0 or redis.call('ZCARD', held_key) < conc
end

-- The earliest waiting runs get a reservation while there is room (or, unlimited, are all
-- woken): their workers' next take finds it.
local function reserve()
  for _ = 1, 1000 do  -- at most 1000 a call: later ones are woken by their recheck
    if packed and not room() then return end
    local head = redis.call('ZPOPMIN', wait_key)
    if not head[1] then return end
    if packed then
      redis.call('ZADD', held_key, now + reserve_ms, '> ' .. string.match(head[1], ' (.*)$'))
    end
    wake[#wake + 1] = head[1]
  end
end

local function take(run_id, member, waiter, sched)
  if not packed then
    redis.call('ZREM', wait_key, waiter)
    return 0
  end
  if redis.call('ZSCORE', held_key, member) then
    redis.call('ZADD', held_key, now + ttl, member)
    return 0
  end
  local reservation = '> ' .. run_id
  local reserved = redis.call('ZSCORE', held_key, reservation)
  if not reserved then
    local head = redis.call('ZRANGE', wait_key, 0, 0)[1]
    local ahead = head and head ~= waiter
    if ahead or not room() then
      redis.call('ZADD', wait_key, 'NX', sched, waiter)
      if ahead and room() then reserve() end  -- room nobody took (a reservation expired)
      local rank = redis.call('ZRANK', wait_key, waiter)
      if rank and rank < 2 * conc then return recheck_first end
      if rank and rank < 20 * conc then return recheck_later end
      return 10 * recheck_later  -- deep in a large backlog: only a lost pop needs it
    end
  end
  if rate > 0 then
    redis.call('ZREMRANGEBYSCORE', log_key, '-inf', now - period)
    if redis.call('ZCARD', log_key) >= rate then
      -- Not queued in KEYS[4]: it asks again at its turn (its reservation goes), when the
      -- start it would replace leaves the window: the (ahead mod rate)-th oldest, that many
      -- periods later again for each `rate` runs told before it.
      if reserved then redis.call('ZREM', held_key, reservation) end
      redis.call('ZREM', wait_key, waiter)
      redis.call('ZREMRANGEBYSCORE', rate_key, '-inf', now - reserve_ms)
      -- Behind every run told before it (one asking again, too: its siblings keep their turns).
      local ahead = redis.call('ZCARD', rate_key) - redis.call('ZREM', rate_key, run_id)
      local slot = redis.call('ZRANGE', log_key, ahead % rate, ahead % rate, 'WITHSCORES')
      local at = tonumber(slot[2]) + period * (1 + math.floor(ahead / rate))
      redis.call('ZADD', rate_key, string.format('%d', at), run_id)
      return math.max(1, at - now)
    end
    local at = string.format('%d', now)
    redis.call('ZADD', log_key, at, run_id .. ' ' .. at)
    redis.call('PEXPIRE', log_key, period)
    redis.call('ZREM', rate_key, run_id)
  end
  if reserved then redis.call('ZREM', held_key, reservation) end
  redis.call('ZREM', wait_key, waiter)
  redis.call('ZADD', held_key, now + ttl, member)
  return 0
end

for i = 6, #ARGV, 4 do
  local op, run_id, worker, partition = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local member = run_id .. ' ' .. worker
  if op == 't' then
    out[#out + 1] = take(run_id, member, partition .. ' ' .. run_id,
                         string.match(run_id, '@(%d+)$'))
  elseif op == 'k' then
    if redis.call('ZSCORE', held_key, member) then
      redis.call('ZADD', held_key, now + ttl, member)
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  elseif op == 'g' then
    out[#out + 1] = redis.call('ZREM', held_key, member)
    reserve()
  else
    reserve()
    out[#out + 1] = 0
  end
end
for _, w in ipairs(wake) do out[#out + 1] = w end
return out
