--[[ limit: store or delete one limit definition in one partition, and apply it at once.

Every partition holds every family, and a key's own definition is held by the key's partition
(rsched.rdb.limit_scripts writes them, after the global index rsched:limits), so a claim reads
its key's definition on its own slot.  After the change the partition's field '' (how many keys
have their own, then the families) is rebuilt from the hash, and each key with waiting runs
(KEYS[3]) is looked at again: a raised limit or a deletion admits its waiting runs in order
(made due now in the retry set, the dispatchers woken); a lowered one starts nothing new until
the key is below it.  include limits builds the per-key keys from the partition's prefix (see
there) and PUBLISHes on the wake channel.  Safe to apply twice.

KEYS[1] rsched:{pN}:limits   HASH  name -> 'concurrency rate period_ms'; '' -> how many keys
                                   have their own, then the families, '<name>\t<packed>' lines,
                                   longest name first
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
-- Field '': how many keys have a definition of their own here, then every family as a
-- '<name>\t<packed>' line, longest name first (then by name): the first a key starts with is
-- its longest prefix.  include limits reads it once per call, and asks for a key's own
-- definition only while the count is not 0.
local fams, exact = {}, 0
local all = redis.call('HGETALL', limits_key)
for i = 1, #all, 2 do
  local n = all[i]
  if string.sub(n, -1) == '*' then
    fams[#fams + 1] = n .. '\t' .. all[i + 1]
  elseif n ~= '' then
    exact = exact + 1
  end
end
table.sort(fams, function(a, b)
  local na, nb = string.find(a, '\t', 1, true), string.find(b, '\t', 1, true)
  if na ~= nb then return na > nb end
  return a < b
end)
if #fams > 0 or exact > 0 then
  fams[0] = tostring(exact)
  redis.call('HSET', limits_key, '', table.concat(fams, '\n', 0))
else
  redis.call('HDEL', limits_key, '')
end
local prefix = lim_prefix(limits_key)
local admitted = 0
for _, lkey in ipairs(redis.call('SMEMBERS', limwait_key)) do
  admitted = admitted + lim_promote(prefix, lkey, retry_key, now)
end
if admitted > 0 then lim_wake(prefix) end
lim_index(prefix)
return admitted
