--[[ limit_keys: the limit keys of one partition that are busy, a page at a time, each with its
counts: what the metrics (in flight per definition) and a definition's busiest keys read.

A key is busy while it has runs holding a slot, runs waiting, or starts in its rate window.
Every key that takes a slot is added to KEYS[1] (include limits, lim_take: one SADD per run
started); this script walks that set with SSCAN and lets go of the keys it finds idle, so the
set holds the keys busy since the last walk, not every key ever seen.  Keys with waiting runs
(KEYS[2]) are read on the first page too (a key held by its rate may hold no slot).  include
limits builds the per-key keys from the partition's prefix (see there), and so does lim_counts
here (kept out of the include, which the hot scripts load).

KEYS[1] rsched:{pN}:limrun   SET  limit keys that took a slot (include limits)
KEYS[2] rsched:{pN}:limwait  SET  limit keys with waiting runs
ARGV[1] cursor ('0' = the first page)   ARGV[2] keys to look at (SSCAN's COUNT)
ARGV[3] now_ms (0 = Redis TIME)
Returns {next cursor ('0' = done), then per busy key: key, definition name ('' = none),
         in flight, waiting, starts in its rate window (0 without a rate)}
]]
--!include util
--!include limits
local limrun_key, limwait_key = KEYS[1], KEYS[2]
local now = now_ms(ARGV[3])
local prefix = lim_prefix(limrun_key)

-- The counts of lkey now: the name of its definition ('' = none), runs
-- holding a slot, runs waiting, starts in its rate window (0 without a rate).  A key with none
-- of them and no rate window left (the log expires with its period) leaves the partition's
-- limrun set: returns nil then.
local function lim_counts(lkey)
  local run_key = lim_key(prefix, lkey, 'run')
  local wait_key = lim_key(prefix, lkey, 'wait')
  local log_key = lim_key(prefix, lkey, 'log')
  local running = redis.call('SCARD', run_key)
  local waiting = redis.call('ZCARD', wait_key)
  local d = lim_def(prefix, lkey)
  local recent = 0
  if d and d.rate > 0 then
    recent = redis.call('ZCOUNT', log_key, '(' .. string.format('%d', now - d.period), '+inf')
  end
  if running == 0 and waiting == 0 and redis.call('EXISTS', log_key) == 0 then
    redis.call('SREM', limrun_key, lkey)
    return nil
  end
  return {d and d.name or '', running, waiting, recent}
end

local page = redis.call('SSCAN', limrun_key, ARGV[1], 'COUNT', ARGV[2])
local out, seen = {page[1]}, {}
local function add(lkey)
  if seen[lkey] then return end
  seen[lkey] = true
  local c = lim_counts(lkey)
  if c then
    out[#out + 1] = lkey
    for _, v in ipairs(c) do out[#out + 1] = v end
  end
end
for _, lkey in ipairs(page[2]) do add(lkey) end
if ARGV[1] == '0' then
  for _, lkey in ipairs(redis.call('SMEMBERS', limwait_key)) do
    if redis.call('SISMEMBER', limrun_key, lkey) == 0 then add(lkey) end
  end
end
return out
