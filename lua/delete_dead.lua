--[[ delete_dead: delete dead letters for good, each deletion recorded in its run's history.

A plain run's hash is deleted and a record (status 'deleted', error 'deleted by <who>', ended_ms
the deletion time) goes on the job's history list; a one-off job's own run, whose fields live in
the job hash, is marked 'deleted' there and its record kept as an 'h:' field, like its attempts
(remember in util).  Each deletion emits a 'dead_deleted' event carrying 'by' (the archive keeps
it).  A run id no longer in the dead set (replayed or deleted meanwhile) changes nothing.
A purge (a background operation) names itself: the deletions are counted under its id in the
partition's count hash in the same call, so its count is exact even if its runner dies between
this call and recording its progress (service.operations sums the partitions' counts).

KEYS[1] rsched:{pN}:dead ZSET   KEYS[2] rsched:{pN}:events STREAM
KEYS[3] rsched:{pN}:opcounts HASH  operation id -> dead letters it deleted here
then per run 3 keys: rsched:{pN}:run:<run id> HASH, rsched:{pN}:job:<id> HASH,
                     rsched:{pN}:hist:<id> LIST
ARGV[1] now_ms (0 = Redis TIME)   ARGV[2] events_maxlen   ARGV[3] who (API key name, 'cli')
ARGV[4] history length            ARGV[5] operation id ('' = not a purge's deletion)
ARGV[6] keep_ms: how long the count hash is kept after its last count
ARGV[7] n runs          then per run 1 value: run id
Returns {code_1, ..., code_n}: 1 deleted, 0 not a dead letter (gone, replayed or deleted)
]]
--!include layout
--!include util
local dead_key, events_key, counts_key = KEYS[1], KEYS[2], KEYS[3]
local now, maxlen, who = now_ms(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local hlen, op_id, keep_ms, n = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local out = {}
local deleted = 0
for i = 1, n do
  local run_id = ARGV[7 + i]
  local b = 3 + 3 * (i - 1)
  local run_key, job_key, hist_key = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
  out[i] = 0
  if redis.call('ZREM', dead_key, run_id) == 1 then
    local rkey, F = run_home(run_id, run_key, job_key, redis.call('HGET', job_key, J.own_run))
    local r = redis.call('HMGET', rkey, F.state, F.attempt, F.type)
    if r[1] == 'dead' then
      local own = F == OWN_RUN
      local rec = {run = run_id, attempt = tonumber(r[2]) or 0, status = 'deleted',
                   sched_ms = tonumber(string.match(run_id, '@(%d+)$')), ended_ms = now,
                   error = 'deleted from the dead letters by ' .. who}
      if own then
        redis.call('HSET', job_key, F.state, 'deleted')
      else
        redis.call('DEL', run_key)
      end
      remember(job_key, hist_key, hlen, own, 'deleted-' .. string.format('%d', now), rec)
      emit(events_key, maxlen, 'e', 'dead_deleted', 'j', string.match(run_id, '^(.*)@%d+$'),
           'r', run_id, 'a', r[2] or '', 't', now, 'by', who, 'ty', r[3] or '')
      out[i] = 1
      deleted = deleted + 1
    end
  end
end
if op_id ~= '' and deleted > 0 then
  redis.call('HINCRBY', counts_key, op_id, deleted)
  redis.call('PEXPIRE', counts_key, keep_ms)
end
return out
