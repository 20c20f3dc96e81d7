--[[ heartbeat: a worker proves it still runs these runs.

Resets each stream entry's idle time (XCLAIM to itself, JUSTID) so XAUTOCLAIM in other workers
leaves it alone, but only while the run is still the caller's under the caller's fence and the
entry is still delivered to the caller: a worker that was reclaimed (its entry moved to another
consumer by XAUTOCLAIM, whether or not the reclaimer has started the run yet) cannot take its
entry back.  Such a heartbeat is fenced: counted ('fenced' in stats) and logged as an event.  A run's
progress (what its handler last reported, ctx.progress) rides on the heartbeat: written to the
run and sent as a 'progress' event only while the run is the caller's under its fence, so a
worker whose run was reclaimed cannot write it.

KEYS[1] rsched:{pN}:events STREAM   KEYS[2] rsched:{pN}:stats HASH
then per run 3 keys: rsched:{pN}:run:<run id> HASH (the job key again for a one-off job's own
        run: see run_fields in util), rsched:{pN}:job:<id> HASH, rsched:{pN}:q:<queue> STREAM
ARGV[1] worker id   ARGV[2] now_ms (0 = Redis TIME)   ARGV[3] group   ARGV[4] n
ARGV[5] events_maxlen
then per run 4 values: run id, fence, stream entry id, progress (JSON {"value", "message",
        "at"}; '' = nothing new)
Returns {code_1, ..., code_n}: 1 still ours, 2 still ours and asked to stop (overlap
  cancelPrevious: the job's field 'cancel' names the run), 0 finished or gone (nothing to fence),
  -1 fenced: the run is live under another worker or fence, or its entry is delivered to
  another consumer
]]
--!include layout
--!include util
--!include delivery
local events_key, stats_key = KEYS[1], KEYS[2]
local worker = ARGV[1]
local now = now_ms(ARGV[2])
local group, n, maxlen = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
for i = 1, n do
  local run_key, job_key, stream_key = KEYS[3 * i], KEYS[3 * i + 1], KEYS[3 * i + 2]
  local at = 5 + 4 * (i - 1)
  local run_id, fence, sid, progress = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  local F = run_fields(run_key, job_key)
  local r = redis.call('HMGET', run_key, F.state, F.worker, F.fence, F.stream_id, F.attempt,
                       F.type)
  local state = r[1]
  local live = (state == 'running' or state == 'dispatched') and r[4] == sid
  local owner = live and delivered_to(stream_key, group, sid)
  if state == 'running' and r[2] == worker and r[3] == fence and owner == worker then
    if progress ~= '' then
      redis.call('HSET', run_key, F.hb_ms, now, F.progress, progress)
      emit(events_key, maxlen, 'e', 'progress', 'j', string.match(run_id, '^(.*)@%d+$') or '',
           'r', run_id, 'a', r[5] or '', 't', now, 'w', worker, 'ty', r[6] or '', 'pg', progress)
    else
      redis.call('HSET', run_key, F.hb_ms, now)
    end
    redis.call('XCLAIM', stream_key, group, worker, 0, sid, 'JUSTID')
    out[i] = redis.call('HGET', job_key, 'cancel') == run_id and 2 or 1
  elseif live then
    redis.call('HINCRBY', stats_key, 'fenced', 1)
    emit(events_key, maxlen, 'e', 'fenced', 'j', string.match(run_id, '^(.*)@%d+$') or '',
         'r', run_id, 'a', r[5] or '', 't', now, 'w', worker, 'f', fence, 'ty', r[6] or '',
         'err', 'stale heartbeat rejected: the run is ' .. state .. ' under worker '
                .. (r[2] or '') .. ', fence ' .. (r[3] or '0') .. ', delivered to '
                .. (owner or 'nobody'))
    out[i] = -1
  else
    out[i] = 0
  end
end
return out
