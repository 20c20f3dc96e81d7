--[[ park: a worker sets aside stream entries of job types it has no handler for, without
starting them (no attempt is spent), for a worker that has the handler; or dead-letters one
whose type no live worker has served on its queue for the handler wait.

A set-aside entry stays in the group's pending entries list, moved (XCLAIM, JUSTID) to the
consumer ARGV[8] .. <type> ('nohandler:<type>'): no consumer reads it again as new, a worker
with the handler takes it from there (start.lua, reclaimed '2'), and any worker's XAUTOCLAIM
takes it once idle longer than the visibility timeout (a worker without the handler then calls
this again).  The run keeps
'nh' = '<entry id> <ms>': since when it waits under this entry (kept when set aside again; a
start deletes it, and start.lua does not count an attempt for a run so set aside).  Only the
entry's current delivery may set it aside: the caller must own it in the pending list.

The wait is measured from the later of the first set-aside and the last time a live worker
served the type on the queue (ARGV served_ms); at the handler wait ARGV[6] with no live worker
serving it now, the run is dead-lettered with the error 'no live worker serves type <t> on queue
<q> for <s> s'.  A set-aside entry's idle time is set so that XAUTOCLAIM takes it again when its
wait ends, if that is sooner than the visibility timeout.

KEYS[1] rsched:{pN}:events STREAM   KEYS[2] rsched:{pN}:stats HASH
KEYS[3] rsched:{pN}:dead ZSET       KEYS[4] rsched:{pN}:retry ZSET (a buffered run let go when a
        dead-lettered run under an overlap policy ends: release_active in include overlap)
then per entry 3 keys: rsched:{pN}:run:<run id> HASH (the job key again for a one-off job's own
     run: see run_fields in util), rsched:{pN}:job:<id> HASH, rsched:{pN}:q:<queue> STREAM
ARGV[1] worker id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] events_maxlen (0 = unbounded)
ARGV[4] group       ARGV[5] n entries                 ARGV[6] handler wait, ms
ARGV[7] visibility timeout, ms                     ARGV[8] parked consumers' prefix
then per entry 4 values (from ARGV[9]): run id, stream entry id, job type (as the entry names
  it), served_ms ('-1': a live worker serves the type on the run's queue now; else the last time
  one did as the caller knows it, '0': never)
A run set aside keeps its limit slot, if its job has a limit key (it is dispatched); one
dead-lettered here frees it (include limits builds the limit keys from the partition's prefix
and may PUBLISH on the wake channel).
Returns {code_1, ..., code_n}
  1 set aside   2 dead-lettered
  0 not this worker's: delivered to another consumer, or its run is finished, gone or
    re-dispatched under a newer entry (then acknowledged)
]]
--!include layout
--!include util
--!include life
--!include streak
--!include dead_letter
--!include delivery
--!include overlap
--!include limits
local events_key, stats_key, dead_key, retry_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker, now = ARGV[1], now_ms(ARGV[2])
local maxlen, group, n = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local wait, visibility, parked = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local out = {}
for i = 1, n do
  local a = 4 + 4 * i
  local run_id, sid, jtype, served = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], tonumber(ARGV[a + 4])
  local run_key, job_key, stream_key = KEYS[2 + 3 * i], KEYS[3 + 3 * i], KEYS[4 + 3 * i]
  local F = run_fields(run_key, job_key)
  local r = redis.call('HMGET', run_key, F.state, F.attempt, F.stream_id, 'nh', 'ov')
  local live = r[3] == sid and (r[1] == 'dispatched' or r[1] == 'running')
  local owner = delivered_to(stream_key, group, sid)
  out[i] = 0
  if owner == worker and not live then
    redis.call('XACK', stream_key, group, sid)
  elseif owner == worker then
    local since = now
    local mark = r[4]
    if mark and string.sub(mark, 1, #sid + 1) == sid .. ' ' then
      since = tonumber(string.sub(mark, #sid + 2))
    else
      redis.call('HSET', run_key, 'nh', sid .. ' ' .. string.format('%d', now))
    end
    if served >= 0 and served > since then since = served end
    if served >= 0 and now - since >= wait then
      local j = redis.call('HMGET', job_key, J.queue, J.limit_key)
      local queue = j[1] or DEFAULT_QUEUE
      redis.call('HDEL', run_key, 'nh')
      dead_letter(run_key, job_key, F, dead_key, events_key, stats_key, maxlen, now, run_id,
                  string.match(run_id, '^(.*)@%d+$'), r[2] or '1',
                  'no live worker serves type ' .. jtype .. ' on queue ' .. queue .. ' for '
                  .. string.format('%g', wait / 1000) .. ' s', jtype)
      if r[5] == '1' then release_active(job_key, retry_key, run_id, now, run_key) end
      if j[2] then
        lim_drop(lim_prefix(events_key), j[2], run_id, retry_key, now)
        lim_index(lim_prefix(events_key))
      end
      redis.call('XACK', stream_key, group, sid)
      out[i] = 2
    else
      local idle = 0
      if served >= 0 then idle = math.max(0, visibility - (since + wait - now)) end
      redis.call('XCLAIM', stream_key, group, parked .. jtype, 0, sid,
                 'IDLE', string.format('%d', idle), 'JUSTID')
      out[i] = 1
    end
  end
end
return out
