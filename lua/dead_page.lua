--[[ dead_page: the next dead letters of one partition after a keyset cursor, newest first.

Dead letters are listed by (dead ms, run id), both descending: ZREVRANGE's order, tied scores
included (a mass failure dead-letters thousands in one millisecond).  A cursor is the last letter
shown, so a page starts at a place in that order, not at an offset: letters dead-lettered or
deleted (replayed, purged) while a walk goes on shift nothing, and every letter that stays is
listed once.  The letter under the cursor may have gone: its place is found by binary search
among the letters of its millisecond, comparing run ids bytewise as the sorted set orders them
(Lua's `<` follows the server's locale).  Read-only.

KEYS[1]  rsched:{pN}:dead  ZSET  run id -> dead ms
ARGV[1]  after score: the cursor's dead ms ('' = no cursor: from the newest)
ARGV[2]  after run id: the cursor's run id (with after score)
ARGV[3]  top: only letters dead by then, ms ('' = any; without a cursor only)
ARGV[4]  count, the most letters to return
Returns  run id, score, run id, score, ... (at most count letters)
]]
local dead_key = KEYS[1]
local after, after_id, top, count = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

-- a sorts before b as the sorted set compares members (memcmp, then the shorter first)
local function before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local start = 0
if after ~= '' then
  -- The cursor's millisecond holds places [lo, hi) of the newest-first order, its run ids
  -- descending there: the page starts at the first of them sorting below the cursor's.
  local lo = redis.call('ZCOUNT', dead_key, '(' .. after, '+inf')
  local hi = lo + redis.call('ZCOUNT', dead_key, after, after)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if before(redis.call('ZREVRANGE', dead_key, mid, mid)[1], after_id) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  start = lo
elseif top ~= '' then
  start = redis.call('ZCOUNT', dead_key, '(' .. top, '+inf')
end
return redis.call('ZREVRANGE', dead_key, start, start + count - 1, 'WITHSCORES')
