--[[ dead_page: the next dead letters of one partition after a keyset cursor, newest or oldest first.

Dead letters are ordered by (dead ms, run id): newest first is ZREVRANGE's order and oldest first
ZRANGE's, tied scores included (a mass failure dead-letters thousands in one millisecond).  A
cursor is the last letter read, so a page starts at a place in that order, not at an offset:
letters dead-lettered or deleted (replayed, purged) while a walk goes on shift nothing, and
every letter that stays is read once.  The letter under the cursor may have gone: its place is
found by binary search among the letters of its millisecond, comparing run ids bytewise as the
sorted set orders them (Lua's `<` follows the server's locale).  Read-only.

KEYS[1]  rsched:{pN}:dead  ZSET  run id -> dead ms
ARGV[1]  after score: the cursor's dead ms ('' = no cursor: from the first letter of the order)
ARGV[2]  after run id: the cursor's run id (with after score)
ARGV[3]  top: only letters dead by then, ms ('' = any); newest first it is where a walk without
         a cursor starts, oldest first where every walk ends
ARGV[4]  count, the most letters to return
ARGV[5]  order: 'desc' (newest first) or 'asc' (oldest first)
Returns  run id, score, run id, score, ... (at most count letters)
]]
local dead_key = KEYS[1]
local after, after_id, top, count = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local desc = ARGV[5] == 'desc'

-- a sorts before b as the sorted set compares members (memcmp, then the shorter first)
local function before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local range = desc and 'ZREVRANGE' or 'ZRANGE'
local start = 0
if after ~= '' then
  -- The cursor's millisecond holds places [lo, hi) of the order, its run ids descending there
  -- newest first (ascending oldest first): the page starts at the first one past the cursor's.
  local lo
  if desc then
    lo = redis.call('ZCOUNT', dead_key, '(' .. after, '+inf')
  else
    lo = redis.call('ZCOUNT', dead_key, '-inf', '(' .. after)
  end
  local hi = lo + redis.call('ZCOUNT', dead_key, after, after)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call(range, dead_key, mid, mid)[1]
    local past
    if desc then past = before(m, after_id) else past = before(after_id, m) end
    if past then hi = mid else lo = mid + 1 end
  end
  start = lo
elseif desc and top ~= '' then
  start = redis.call('ZCOUNT', dead_key, '(' .. top, '+inf')
end
local got = redis.call(range, dead_key, start, start + count - 1, 'WITHSCORES')
if not desc and top ~= '' then
  local bound = tonumber(top)
  for i = 2, #got, 2 do
    if tonumber(got[i]) > bound then
      for j = #got, i - 1, -1 do got[j] = nil end
      break
    end
  end
end
return got
