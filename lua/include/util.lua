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

-- Prepend a finished attempt to the job's bounded history list.
local function remember(key, len, rec)
  if len > 0 then
    redis.call('LPUSH', key, cjson.encode(rec))
    redis.call('LTRIM', key, 0, len - 1)
  end
end

-- A one-off job whose only regular occurrence was dispatched (next_ms 0) ends with its run,
-- even if paused meanwhile; a trigger's run before that occurrence does not end the job.
local function one_off_done(job_key)
  local j = redis.call('HMGET', job_key, 'status', 'cron', 'next_ms')
  return (j[1] == 'scheduled' or j[1] == 'paused') and (not j[2] or j[2] == '')
    and (not j[3] or j[3] == '0')
end
