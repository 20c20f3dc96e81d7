-- Per-key flow control (docs/limits.md).  A job with a limit key (job field 'lk') lives in its
-- key's partition, so one script on one slot sees all of the key's state.  These keys are built
-- here (lim_key, from the partition's prefix 'rsched:{pN-k}' that lim_prefix reads off a key the
-- script was given) rather than passed in KEYS: which limit keys a call touches is known only
-- once it has read the job hashes.  They all carry the partition's hash tag, so the script stays
-- on one Cluster slot (tests/redis/test_scripts.py allows lim_key and lim_prefix, nothing else).
--   <prefix>:limits          HASH  definition name -> 'concurrency rate period_ms' (0 = none,
--                                  core.limits.Limit.packed): every family, and the keys of
--                                  this partition that have their own; field '' -> how many
--                                  such keys, then every family as a '<name>\t<packed>' line,
--                                  longest name first
--   <prefix>:lim:<key>:run   SET   run ids holding one of the key's slots (kept for every
--                                  keyed run, defined or not, so a new definition counts them)
--   <prefix>:lim:<key>:wait  ZSET  run id -> scheduled ms: runs waiting for the key, in order
--   <prefix>:lim:<key>:log   ZSET  '<run id> <ms>' -> start ms: the rate's sliding window
--   <prefix>:limwait         SET   keys that have waiting runs (a definition's change looks
--                                  at them: lua/limit.lua)
--   <prefix>:limstats        HASH  definition name -> runs that started waiting for it
--   <prefix>:limrun          SET   keys that took a slot since lua/limit_keys.lua last found
--                                  them idle: what the metrics and the busiest keys read;
--                                  lim_take notes the key, lim_index adds a call's keys in one
--                                  SADD at the end of the script
--   <prefix>:retry           ZSET  the partition's retry set (expire.lua is not given it)
-- rsched.rdb.keys names the same keys (limits, limit_running, limit_waiting, limit_log,
-- limits_waiting, limits_running, retry).
-- A slot belongs to a run id: a reclaim's new fenced attempt keeps it, and only an ending
-- accepted under the run's current fence (complete.lua, start.lua, expire.lua) frees it.
-- A run that waits spends no attempt: its state is 'waiting' and it is in no queue stream; it
-- is admitted (slot taken, start logged) in key order and then sent through the retry set,
-- where claim.lua dispatches it as a run already holding its slot.

local function lim_prefix(key) return string.match(key, '^(.-})') end

-- The key of one kind of a limit key's state ('run', 'wait', 'log'), or with lkey nil one of
-- the partition's ('limits', 'limwait', 'retry').
local function lim_key(prefix, lkey, kind)
  if lkey then return prefix .. ':lim:' .. lkey .. ':' .. kind end
  return prefix .. ':' .. kind
end

-- The definition that applies to lkey: {name, conc, rate, period} or false (none), read once
-- per key and call; the family list (field '') once per call.
local LIM_DEFS, LIM_FAMS, LIM_EXACT = {}, nil, true
local function lim_parse(name, text)
  local c, r, p = string.match(text, '^(%d+) (%d+) (%d+)$')
  return {name = name, conc = tonumber(c), rate = tonumber(r), period = tonumber(p)}
end
local function lim_def(prefix, lkey)
  local d = LIM_DEFS[lkey]
  if d ~= nil then return d end
  local limits_key = lim_key(prefix, nil, 'limits')
  local text
  if not LIM_FAMS then
    local v = redis.call('HMGET', limits_key, lkey, '')
    text, LIM_FAMS = v[1], {}
    -- A first line '<n>' (the keys of this partition with a definition of their own), then
    -- '<family name>\t<packed>' lines, longest name first (lua/limit.lua writes them).
    local head, fams = string.match(v[2] or '0', '^(%d+)(.*)$')
    LIM_EXACT = head ~= '0'
    for name, packed in string.gmatch(fams, '([^\t\n]+)\t([^\n]+)') do
      LIM_FAMS[#LIM_FAMS + 1] = {string.sub(name, 1, -2), lim_parse(name, packed)}
    end
  elseif LIM_EXACT then
    text = redis.call('HGET', limits_key, lkey)
  end
  d = false
  if text then
    d = lim_parse(lkey, text)
  else
    for _, fam in ipairs(LIM_FAMS) do
      if string.find(lkey, fam[1], 1, true) == 1 then  -- a prefix of it (no substring made)
        d = fam[2]
        break
      end
    end
  end
  LIM_DEFS[lkey] = d
  return d
end

-- Whether one more run of lkey (its slots in run_key) may start now; if not and the rate is
-- what holds it, the ms at which the window lets the next one start.
local function lim_room(prefix, lkey, run_key, d, now)
  if not d then return true end
  if d.conc > 0 and redis.call('SCARD', run_key) >= d.conc then return false end
  if d.rate > 0 then
    local log_key = lim_key(prefix, lkey, 'log')
    redis.call('ZREMRANGEBYSCORE', log_key, '-inf', now - d.period)
    if redis.call('ZCARD', log_key) >= d.rate then
      local first = redis.call('ZRANGE', log_key, 0, 0, 'WITHSCORES')
      return false, tonumber(first[2]) + d.period
    end
  end
  return true
end

-- The keys that took a slot in this call, for lim_index (one SADD a call, not one a run).
local LIM_TAKEN, LIM_TAKEN_LIST = {}, {}

local function lim_take(prefix, lkey, run_key, d, run_id, now)
  redis.call('SADD', run_key, run_id)
  if not LIM_TAKEN[lkey] then
    LIM_TAKEN[lkey] = true
    LIM_TAKEN_LIST[#LIM_TAKEN_LIST + 1] = lkey
  end
  if d and d.rate > 0 then
    local log_key = lim_key(prefix, lkey, 'log')
    local at = string.format('%d', now)
    redis.call('ZADD', log_key, at, run_id .. ' ' .. at)
    redis.call('PEXPIRE', log_key, d.period)
  end
end

-- Add the keys that took a slot in this call to the partition's limrun set: every script that
-- may take one calls it before it returns.
local function lim_index(prefix)
  if #LIM_TAKEN_LIST == 0 then return end
  local limrun_key = lim_key(prefix, nil, 'limrun')
  for k = 1, #LIM_TAKEN_LIST, 1000 do
    redis.call('SADD', limrun_key, unpack(LIM_TAKEN_LIST, k, math.min(k + 999, #LIM_TAKEN_LIST)))
  end
  LIM_TAKEN_LIST = {}
end

-- Admit waiting runs of lkey in order while there is room.  Without a rate, each takes its slot
-- and is made due now in the retry set (claim.lua dispatches it holding the slot); at most 1000
-- a call, every later ending admits more.  With a rate, a start is logged when its run is
-- dispatched (the window counts dispatches on Redis's clock, not admissions a round earlier):
-- only the head is made due, now if there is room, else when the window lets it start (a head
-- held by the concurrency waits for an ending); the claim that dispatches it makes the next one
-- due.  Returns how many runs it made due now (the caller wakes the dispatchers).
local function lim_promote(prefix, lkey, retry_key, now)
  local wait_key = lim_key(prefix, lkey, 'wait')
  local run_key = lim_key(prefix, lkey, 'run')
  local d = lim_def(prefix, lkey)
  local moved = 0
  while moved < 1000 do
    local head = redis.call('ZRANGE', wait_key, 0, 0)[1]
    if not head then
      local limwait_key = lim_key(prefix, nil, 'limwait')
      redis.call('SREM', limwait_key, lkey)
      break
    end
    local ok, at = lim_room(prefix, lkey, run_key, d, now)
    if not ok then
      if at then redis.call('ZADD', retry_key, at, head) end
      break
    end
    redis.call('ZADD', retry_key, now, head)
    moved = moved + 1
    if d and d.rate > 0 then break end
    redis.call('ZREM', wait_key, head)
    lim_take(prefix, lkey, run_key, d, head, now)
  end
  return moved
end

-- Run run_id of lkey (scheduled at the time its id ends with) asks to start now: true if it
-- holds a slot (taken here, or at its admission: fresh is false for a run that may have been
-- admitted before, one from the retry set), else it waits in the key's set, the definition that
-- holds it returned.  Runs start in the order of their scheduled times: with runs already
-- waiting, this one queues among them.  Under a concurrency limit alone, room means nobody
-- waits (every ending and every change admits waiters while there is room), so only a rate
-- asks for the waiting set.  The caller has taken run_id out of the retry set.
local function lim_admit(prefix, lkey, run_id, retry_key, now, fresh)
  local run_key = lim_key(prefix, lkey, 'run')
  if not fresh and redis.call('SISMEMBER', run_key, run_id) == 1 then return true end
  local d = lim_def(prefix, lkey)
  if not d then  -- unlimited, but counted: a definition made later counts its runs
    lim_take(prefix, lkey, run_key, d, run_id, now)
    return true
  end
  local wait_key = lim_key(prefix, lkey, 'wait')
  local first = true  -- no run waits ahead of it
  if d.rate > 0 then
    local head = redis.call('ZRANGE', wait_key, 0, 0, 'WITHSCORES')
    first = not head[1] or head[1] == run_id
      or tonumber(string.match(run_id, '@(%d+)$')) < tonumber(head[2])
  end
  local ok, at = false, nil
  if not first then
    ok = false
  elseif d.rate == 0 then  -- the usual case, written out: two commands
    ok = redis.call('SCARD', run_key) < d.conc
  else
    ok, at = lim_room(prefix, lkey, run_key, d, now)
  end
  if ok then
    lim_take(prefix, lkey, run_key, d, run_id, now)
    if d.rate > 0 and redis.call('ZREM', wait_key, run_id) == 1 then
      lim_promote(prefix, lkey, retry_key, now)  -- the next one's turn
    end
    return true
  end
  local limwait_key = lim_key(prefix, nil, 'limwait')
  redis.call('ZADD', wait_key, string.match(run_id, '@(%d+)$'), run_id)
  redis.call('SADD', limwait_key, lkey)
  if at then
    redis.call('ZADD', retry_key, at, run_id)  -- the head, held by the rate
  elseif not first then
    lim_promote(prefix, lkey, retry_key, now)  -- the head's turn, if there is room
  end
  return false, d
end

-- A run starts waiting for definition d (not again when it waits on): counted per definition
-- name, never per key, for the metrics (rsched_limit_deferred).
local function lim_deferred(prefix, d)
  local limstats_key = lim_key(prefix, nil, 'limstats')
  redis.call('HINCRBY', limstats_key, d and d.name or '', 1)
end

-- Wake the dispatchers of this partition (channel keys.wake_channel(), 'rsched:wake', payload
-- the partition number, as Client.op_wake sends): a run was made due now.
local function lim_wake(prefix)
  local store, partition = string.match(prefix, '^(.*):{p(%d+)')
  redis.call('PUBLISH', store .. ':wake', partition)
end

-- Run run_id of lkey ends: its slot, if it holds one, is freed once, and the key's earliest
-- waiting runs are admitted (the dispatchers woken).  Returns whether a slot was freed.
local function lim_release(prefix, lkey, run_id, retry_key, now)
  local run_key = lim_key(prefix, lkey, 'run')
  if redis.call('SREM', run_key, run_id) == 0 then return false end
  local wait_key = lim_key(prefix, lkey, 'wait')
  if redis.call('EXISTS', wait_key) == 1 and lim_promote(prefix, lkey, retry_key, now) > 0 then
    lim_wake(prefix)
  end
  return true
end

-- Run run_id of lkey ends without running (cancelled, abandoned, dead-lettered): out of the
-- key's waiting set too, and its slot freed if it held one.  A waiting run that leaves passes
-- its turn on (under a rate, the head made due is the one that makes the next one due).
local function lim_drop(prefix, lkey, run_id, retry_key, now)
  local wait_key = lim_key(prefix, lkey, 'wait')
  local waited = redis.call('ZREM', wait_key, run_id) == 1
  if lim_release(prefix, lkey, run_id, retry_key, now) then return true end
  if waited and lim_promote(prefix, lkey, retry_key, now) > 0 then lim_wake(prefix) end
  return false
end

