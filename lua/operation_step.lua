--[[ operation_step: take, keep or end a background operation (a dead-letter purge) under a
lease, recording its progress: one runner works on an operation at a time, and a runner whose
lease another took over (it stalled past lease_ms) changes nothing.  The fence grows with each
take-over, so a stale runner is refused even if its lease would still look unexpired to it.

KEYS[1]  rsched:operation:<id>  HASH  status (running|succeeded|failed|cancelled), owner,
         lease_ms (expiry), fence, updated_ms, ended_ms, and the progress fields service.
         operations writes (scanned, matched, deleted, cursor, ...)
ARGV[1]  owner: the runner's id
ARGV[2]  fence the runner holds (0: none yet: take the operation if no live lease holds it)
ARGV[3]  lease_ms: how long the lease lasts from now
ARGV[4]  now_ms (0 = Redis TIME)
ARGV[5]  end status: '' keeps it running; 'succeeded' or 'failed' ends it (the lease goes)
ARGV[6]  keep_ms: how long an ended operation's hash is kept
ARGV[7]  n, then n field, value pairs to set (progress), written only by the lease's holder
Returns  {code, fence}: 1 held (the fence to send next), 0 another runner holds it (or the
         caller's fence is stale), -1 ended already (cancelled, succeeded or failed),
         -2 no such operation
]]
--!include util
local op_key = KEYS[1]
local owner, fence, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, end_status, keep_ms = now_ms(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local s = redis.call('HMGET', op_key, 'status', 'owner', 'lease_ms', 'fence')
if not s[1] then return {-2, 0} end
if s[1] ~= 'running' then return {-1, 0} end
local held = tonumber(s[4] or '0')
if fence == 0 then
  if s[2] and s[2] ~= '' and tonumber(s[3] or '0') > now then return {0, held} end
  held = held + 1
  fence = held
elseif fence ~= held or s[2] ~= owner then
  return {0, held}
end
local n = tonumber(ARGV[7])
local set = {'owner', owner, 'fence', fence, 'lease_ms', now + lease_ms, 'updated_ms', now}
for i = 8, 7 + 2 * n do set[#set + 1] = ARGV[i] end
if end_status ~= '' then
  set[#set + 1], set[#set + 2] = 'status', end_status
  set[#set + 1], set[#set + 2] = 'ended_ms', now
  set[#set + 1], set[#set + 2] = 'owner', ''
end
redis.call('HSET', op_key, unpack(set))
if end_status ~= '' then redis.call('PEXPIRE', op_key, keep_ms) end
return {1, fence}
