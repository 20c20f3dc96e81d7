--[[ trim_streams: bound one partition's streams, run by the dispatcher every few seconds for the
partitions it holds (rsched.engine.dispatcher.trimmer): its events stream, and its queue streams'
entries every worker has acknowledged (which schedule.lua and claim.lua drop only when they add
to a stream, so a burst's entries would otherwise stay until the next one).

A stream read by consumer groups (the archivers', keys.EVENTS_GROUP) is trimmed to what every
group has read: below the oldest entry any group still has pending, else below the entry after
its last delivered one; nothing a group has not read goes, however long it is down.  A stream no
group reads (no archiver has ever registered) is trimmed to the newest ARGV[1] entries and to
entries younger than ARGV[2] ms: an archiver registering later starts from what is left, and
followers (Client.wait, the SSE streams) resume only within it.  Trimming is approximate
(`~`): whole stream nodes go, at most XTRIM's default LIMIT entries a call (100 nodes), so one
call stays short and later calls catch up with a backlog.  Checking the groups and trimming in
one script leaves no gap for an archiver to register in between.

KEYS[1] rsched:{pN}:events STREAM
KEYS[2..] rsched:{pN}:q:<queue> STREAM, each queue of the partition (rsched:{pN}:queues)
ARGV[1] keep: entries kept at most without a group (0 = no length bound)
ARGV[2] keep_ms: age past which entries go without a group (0 = no age bound)
ARGV[3] now_ms (0 = Redis TIME)
ARGV[4] the workers' consumer group on the queue streams
Returns {trimmed, groups}: events entries removed (0 or more) and the consumer groups reading
the events stream (0: it was trimmed to ARGV[1] and ARGV[2])
]]
--!include util
--!include trim_acked
local events_key = KEYS[1]
local keep, keep_ms, now = tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms(ARGV[3])

for k = 2, #KEYS do trim_acked(KEYS[k], ARGV[4]) end
if redis.call('EXISTS', events_key) == 0 then return {0, 0} end
local groups = redis.call('XINFO', 'GROUPS', events_key)
if #groups > 0 then
  -- The lowest read point of every group: its oldest pending entry, else the one after its
  -- last delivered entry; a group that has read nothing yet keeps everything.
  local point_ms, point_seq = nil, nil
  for _, g in ipairs(groups) do
    local name, last
    for k = 1, #g, 2 do
      if g[k] == 'name' then name = g[k + 1] end
      if g[k] == 'last-delivered-id' then last = g[k + 1] end
    end
    local pending = redis.call('XPENDING', events_key, name)
    local ms, seq
    if pending[2] then
      ms, seq = string.match(pending[2], '^(%d+)-(%d+)$')
      ms, seq = tonumber(ms), tonumber(seq)
    else
      ms, seq = string.match(last, '^(%d+)-(%d+)$')
      ms, seq = tonumber(ms), tonumber(seq) + 1
    end
    if ms == 0 and seq <= 1 then return {0, #groups} end
    if not point_ms or ms < point_ms or (ms == point_ms and seq < point_seq) then
      point_ms, point_seq = ms, seq
    end
  end
  local trimmed = redis.call('XTRIM', events_key, 'MINID', '~',
                             string.format('%d-%d', point_ms, point_seq))
  return {trimmed, #groups}
end
local trimmed = 0
if keep > 0 then
  trimmed = trimmed + redis.call('XTRIM', events_key, 'MAXLEN', '~', keep)
end
if keep_ms > 0 and now > keep_ms then
  trimmed = trimmed + redis.call('XTRIM', events_key, 'MINID', '~',
                                 string.format('%d-0', now - keep_ms))
end
return {trimmed, 0}
