-- Shared helpers, inlined into every script that says `--!include util`.

-- Redis's own clock unless the caller injects one (tests): one clock for every dispatcher.
local function now_ms(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Append one history event; maxlen 0 keeps everything until the archiver trims it.
local function emit(key, maxlen, ...)
  if maxlen > 0 then
    return redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', ...)
  end
  return redis.call('XADD', key, '*', ...)
end

-- Record a finished attempt.  A one-off job's own run ('once' = '1', a few attempts at most)
-- keeps its records as 'h:<stream id>:<attempt>' fields of the job hash: creating a list key per
-- job cost a third of the complete script.  Other runs go to the job's bounded history list.
local function remember(job_key, hist_key, len, once, sid, rec)
  if once == '1' then
    redis.call('HSET', job_key, 'h:' .. sid .. ':' .. rec.attempt, cjson.encode(rec))
  elseif len > 0 then
    redis.call('LPUSH', hist_key, cjson.encode(rec))
    redis.call('LTRIM', hist_key, 0, len - 1)
  end
end

-- A one-off job whose only regular occurrence was dispatched (next_ms 0) ends with its run,
-- even if paused meanwhile; a trigger's run before that occurrence does not end the job.
local function one_off_done(job_key)
  local j = redis.call('HMGET', job_key, 'status', 'cron', 'next_ms')
  return (j[1] == 'scheduled' or j[1] == 'paused') and (not j[2] or j[2] == '')
    and (not j[3] or j[3] == '0')
end
