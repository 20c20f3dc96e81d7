-- Whether run `run_id` (its attempt and dispatched_ms as read) would start past its job's start
-- deadline (startDeadlineSeconds: spec_life in include life): its first attempt, dispatched by
-- the deadline (a replay or trigger dispatched after it is a deliberate run), and now past it.
local function missed_start(job_spec, run_id, attempt, dispatched_ms, now)
  local life = spec_life(job_spec)
  if not life or life[4] == 0 or attempt ~= '1' then return false end
  local deadline = tonumber(string.match(run_id, '@(%d+)$')) + life[4]
  return now > deadline and tonumber(dispatched_ms or '0') <= deadline
end
