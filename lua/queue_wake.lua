--[[ queue_wake: make waiting runs of a limited queue due now in their partition.

A run its queue's limit held (lua/queue_permit.lua) waits in its partition's retry set until
its recheck time; once a permit is reserved for it, whoever got the reservation calls this so
it is dispatched now, and wakes the partition's dispatchers.  A run not in the retry set (its
worker has not put it back yet, or it moved on) is left alone: its recheck brings it.  Safe to
apply twice.  include limits builds the wake channel's name from the partition's prefix.

KEYS[1] rsched:{pN}:retry  ZSET  run id -> due ms
ARGV[1] now_ms (0 = Redis TIME)   ARGV[2..] run ids
Returns the number of runs made due now
]]
--!include util
--!include limits
local retry_key = KEYS[1]
local now = now_ms(ARGV[1])
local moved = 0
for i = 2, #ARGV do
  local due = redis.call('ZSCORE', retry_key, ARGV[i])
  if due and tonumber(due) > now then
    redis.call('ZADD', retry_key, 'XX', string.format('%d', now), ARGV[i])
    moved = moved + 1
  end
end
if moved > 0 then lim_wake(lim_prefix(retry_key)) end
return moved
