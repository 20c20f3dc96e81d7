--[[ lease: acquire, renew (and offer) or release a dispatcher's lease on one partition.

Every acquisition by a new owner increments the partition's fencing token; the claim script
rejects any caller whose token is not the current one, so a paused or partitioned dispatcher
can never write after someone else took over.

Rebalancing hands a partition over without a gap: the owner keeps renewing it and names the
member it offers it to; that member takes it over with 'acquire' (new fence) when it is ready,
and the old owner's next claim or renewal is refused.  An offer that is not taken costs nothing.

KEYS[1]  rsched:{pN}:lease   HASH owner, expires_ms, fence (never reset), offer
KEYS[2]  rsched:{pN}:stats   HASH counters (lease_changes)
ARGV[1]  owner id
ARGV[2]  lease_ms
ARGV[3]  now_ms (0 = Redis TIME)
ARGV[4]  mode: 'acquire' | 'renew' | 'release'
ARGV[5]  fence the caller holds (renew and release; ignored for acquire)
ARGV[6]  offer_to (renew): the member the lease is offered to, '' or absent for none
Returns {code, fence, expires_ms, owner}
  code 1  caller holds the lease (fence is the token to pass to claim); after a release,
          expires_ms is the release time and owner ''
  code 0  someone else holds it and has not offered it to the caller (owner, expires_ms say
          who and until when)
  code -1 renew/release refused: the caller's fence is stale (it lost the lease)
]]
--!include layout
--!include util
local lease_key, stats_key = KEYS[1], KEYS[2]
local owner, lease_ms, mode, held = ARGV[1], tonumber(ARGV[2]), ARGV[4], ARGV[5]
local offer_to = ARGV[6] or ''
local now = now_ms(ARGV[3])
local l = redis.call('HMGET', lease_key, 'owner', 'expires_ms', 'fence', 'offer')
local cur_owner, expires, fence = l[1] or '', tonumber(l[2] or '0'), l[3] or '0'
local offered = l[4] or ''

if mode == 'acquire' then
  if cur_owner == owner and expires > now then
    redis.call('HSET', lease_key, 'expires_ms', now + lease_ms)
    return {1, fence, now + lease_ms, owner}
  end
  if cur_owner ~= '' and expires > now and offered ~= owner then
    return {0, fence, expires, cur_owner}
  end
  fence = tostring(redis.call('HINCRBY', lease_key, 'fence', 1))
  redis.call('HSET', lease_key, 'owner', owner, 'expires_ms', now + lease_ms, 'offer', '')
  redis.call('HINCRBY', stats_key, 'lease_changes', 1)
  return {1, fence, now + lease_ms, owner}
end

if cur_owner ~= owner or fence ~= held then
  return {-1, fence, expires, cur_owner}
end
if mode == 'renew' then
  -- Renewing after expiry is safe: nobody took over, or the fence would have moved.
  redis.call('HSET', lease_key, 'expires_ms', now + lease_ms, 'offer', offer_to)
  return {1, fence, now + lease_ms, owner}
end
-- Released: expires_ms keeps the time it became free (how long nobody has taken it).
redis.call('HSET', lease_key, 'owner', '', 'expires_ms', now, 'offer', '')
return {1, fence, now, ''}
