--[[ limit: store or delete one limit definition in one partition, and apply it at once.

Every partition holds every definition (rsched.service.limits writes them all, after the global
index rsched:limits), so a claim reads its key's definition on its own slot.  After the change
the partition's family list (field '') is rebuilt from the hash, and each key with waiting runs
(KEYS[3]) is looked at again: a raised limit or a deletion admits its waiting runs in order
(made due now in the retry set, the dispatchers woken); a lowered one starts nothing new until
the key is below it.  include limits builds the per-key keys from the partition's prefix (see
there) and PUBLISHes on the wake channel.  Safe to apply twice.

KEYS[1] rsched:{pN}:limits   HASH  name -> 'concurrency rate period_ms'; '' -> family names
KEYS[2] rsched:{pN}:retry    ZSET  run id -> due ms
KEYS[3] rsched:{pN}:limwait  SET   limit keys with waiting runs
ARGV[1] name   ARGV[2] packed definition ('' = delete it)   ARGV[3] now_ms (0 = Redis TIME)
Returns the number of waiting runs admitted
]]
--!include util
--!include limits
local limits_key, retry_key, limwait_key = KEYS[1], KEYS[2], KEYS[3]
local name, packed = ARGV[1], ARGV[2]
local now = now_ms(ARGV[3])
if packed == '' then
  redis.call('HDEL', limits_key, name)
else
  redis.call('HSET', limits_key, name, packed)
end
if string.sub(name, -1) == '*' then
  local fams = {}
  for _, n in ipairs(redis.call('HKEYS', limits_key)) do
    if string.sub(n, -1) == '*' then fams[#fams + 1] = n end
  end
  -- Longest first (then by name): the first family a key starts with is its longest prefix.
  table.sort(fams, function(a, b)
    if #a ~= #b then return #a > #b end
    return a < b
  end)
  if #fams > 0 then
    redis.call('HSET', limits_key, '', table.concat(fams, '\n'))
  else
    redis.call('HDEL', limits_key, '')
  end
end
local prefix = lim_prefix(limits_key)
local admitted = 0
for _, lkey in ipairs(redis.call('SMEMBERS', limwait_key)) do
  admitted = admitted + lim_promote(prefix, lkey, retry_key, now)
end
if admitted > 0 then lim_wake(prefix) end
return admitted
