--[[ take_over: move to the caller the entries a dead worker holds in one queue stream.

The worker missed its process heartbeats (lua/alive.lua) or left with runs pending.  In one
step, so that of two workers taking over at once each entry goes to one: the entries pending
under the dead consumer and idle at least min_idle_ms (one the dead worker heartbeated since,
woken up, stays its own) are claimed for the caller (XCLAIM) and returned with their fields; the
caller starts them with lua/start.lua (reclaimed '1': a new fence, the lost attempt counted).

KEYS[1] rsched:{pN}:q:<queue> STREAM
ARGV[1] group   ARGV[2] the dead worker (its consumer name)   ARGV[3] the caller's worker id
ARGV[4] min_idle_ms   ARGV[5] count: at most this many entries
Returns {left, id_1, fields_1, ..., id_n, fields_n}: left 1 when entries stay pending under the
  dead consumer (more than count, or not idle enough), else 0; fields {field, value, ...} as
  XCLAIM gives them (an entry deleted from the stream is left out)
]]
local stream_key = KEYS[1]
local group, dead, me = ARGV[1], ARGV[2], ARGV[3]
local min_idle, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local pending = redis.call('XPENDING', stream_key, group, '-', '+', count + 1, dead)
local left, ids = 0, {}
for i, e in ipairs(pending) do
  if i > count or e[3] < min_idle then left = 1 else ids[#ids + 1] = e[1] end
end
local out = {left}
if #ids > 0 then
  for _, c in ipairs(redis.call('XCLAIM', stream_key, group, me, 0, unpack(ids))) do
    if c and c[2] then
      out[#out + 1] = c[1]
      out[#out + 1] = c[2]
    end
  end
end
return out
