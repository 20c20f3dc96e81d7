--[[ alive: a worker's process heartbeat, and the workers that missed theirs.

Each worker beats every dead_after / 3 (its event loop does, so a frozen or blocked process
stops).  A member whose last beat is dead_after old or older by Redis's clock is dead: whoever
reads it here takes over its runs at once (rsched.engine.worker.liveness), then removes it.  A
worker that leaves with runs still pending under its name sets its beat to 0 (dead now).

KEYS[1] rsched:alive ZSET worker id -> last beat (ms, Redis time)
ARGV[1] worker id ('' = beat for nobody, only read)   ARGV[2] now_ms (0 = Redis TIME)
ARGV[3] dead_after_ms   ARGV[4] at most this many dead members returned
Returns {now_ms, dead id_1, last beat_1, ...}: the members other than the caller whose last beat
  is at or before now_ms - dead_after_ms, oldest first, with that beat (ms; 0: marked dead)
]]
--!include layout
--!include util
local alive_key = KEYS[1]
local me, dead_after, limit = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms(ARGV[2])
if me ~= '' then redis.call('ZADD', alive_key, now, me) end
local out = {now}
local dead = redis.call('ZRANGEBYSCORE', alive_key, '-inf', now - dead_after, 'WITHSCORES',
                        'LIMIT', 0, limit)
for i = 1, #dead, 2 do
  if dead[i] ~= me then
    out[#out + 1] = dead[i]
    out[#out + 1] = dead[i + 1]
  end
end
return out
