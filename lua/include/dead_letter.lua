-- Move a run whose attempts are used up to the dead letters; a one-off job dies with it, a
-- recurring job's failure streak grows (fail_streak in include streak, which may pause it: the
-- due-set entry of a job paused so is dropped by the next claim, as a paused job's is).
-- F: the run's field names (run_fields).
local function dead_letter(run_key, job_key, F, dead_key, events_key, stats_key, maxlen, now,
                           run_id, job_id, attempt, err, jtype)
  redis.call('HSET', run_key, F.state, 'dead', F.ended_ms, now, F.error, err)
  redis.call('ZADD', dead_key, now, run_id)
  if one_off_done(job_key) then
    redis.call('HSET', job_key, J.status, 'dead', J.updated_ms, now)
  else
    local why = fail_streak(job_key, now, run_id)
    if why then
      emit(events_key, maxlen, 'e', 'paused', 'j', job_id, 't', now, 'ty', jtype or '',
           'err', why)
    end
  end
  redis.call('HINCRBY', stats_key, 'dead_lettered', 1)
  emit(events_key, maxlen, 'e', 'dead_lettered', 'j', job_id, 'r', run_id, 'a', attempt,
       't', now, 'err', err, 'ty', jtype or '')
end
