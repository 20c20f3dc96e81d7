--[[ heartbeat: a worker proves it still runs these runs.

Resets each stream entry's idle time (XCLAIM to itself, JUSTID) so XAUTOCLAIM in other workers
leaves it alone, but only while the run is still the caller's under the caller's fence: a
worker that was already reclaimed cannot take its entry back.

KEYS[3i-2], KEYS[3i-1], KEYS[3i]  per run: rsched:{pN}:run:<run id> HASH (the job key again
        for a one-off job's own run: see run_fields in util), rsched:{pN}:job:<id> HASH,
        rsched:{pN}:q:<queue> STREAM
ARGV[1] worker id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] group   ARGV[4] n
then per run: run id, fence, stream entry id
Returns {ok_1, ..., ok_n}: 1 still ours, 0 lost (reclaimed, cancelled or finished)
]]
--!include util
local worker = ARGV[1]
local now = now_ms(ARGV[2])
local group, n = ARGV[3], tonumber(ARGV[4])
local out = {}
for i = 1, n do
  local run_key, job_key, stream_key = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local fence, sid = ARGV[4 + 3 * i - 1], ARGV[4 + 3 * i]
  local F = run_fields(run_key, job_key)
  local r = redis.call('HMGET', run_key, F.state, F.worker, F.fence)
  if r[1] == 'running' and r[2] == worker and r[3] == fence then
    redis.call('HSET', run_key, F.hb_ms, now)
    redis.call('XCLAIM', stream_key, group, worker, 0, sid, 'JUSTID')
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
