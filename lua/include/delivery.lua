-- The consumer a stream entry is delivered to now (its owner in the group's pending entries
-- list), or nil when nobody holds it (acknowledged, trimmed or never read).  XAUTOCLAIM moves an
-- entry to its reclaimer, so only the current owner's start or heartbeat may count: a worker
-- that stalled and was reclaimed still knows the entry id, but no longer owns its delivery.
local function delivered_to(stream_key, group, sid)
  local p = redis.call('XPENDING', stream_key, group, sid, sid, 1)
  local e = p[1]
  if e then return e[2] end
  return nil
end
