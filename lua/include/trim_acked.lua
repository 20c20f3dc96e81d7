-- Trim a queue stream below the oldest entry its consumer group still needs.
local function trim_acked(stream_key, group)
  if redis.call('EXISTS', stream_key) == 0 then return end
  local groups = redis.call('XINFO', 'GROUPS', stream_key)
  local last = nil
  for _, g in ipairs(groups) do
    for k = 1, #g, 2 do
      if g[k] == 'name' and g[k + 1] ~= group then break end
      if g[k] == 'last-delivered-id' then last = g[k + 1] end
    end
  end
  if not last or last == '0-0' then return end
  local pending = redis.call('XPENDING', stream_key, group)
  local minid = pending[2]
  if not minid then
    local ms, seq = string.match(last, '^(%d+)-(%d+)$')
    minid = ms .. '-' .. (tonumber(seq) + 1)
  end
  redis.call('XTRIM', stream_key, 'MINID', '~', minid)
end
