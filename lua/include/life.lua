-- A job's lifecycle limits read off the end of its packed spec (core.lifecycle.life_packed: the
-- spec's last element, left out without limits, else the text 'L<start_at_ms>,<end_at_ms>,
-- <max_runs>,<start_deadline_ms>,<pause_after>'): {start_at_ms, end_at_ms, max_runs,
-- start_deadline_ms, pause_after}, 0 = none, or nil.  Only a spec with limits has all of
-- models.SPEC_STORED's 13 elements (its first byte, the array's header, is 0x9d:
-- models.SPEC_WITH_LIFE): one byte tells them apart on the hot path.
-- (Redis's cmsgpack cannot decode the spec: it refuses msgpack's bin type, the payload's.)
local SPEC_WITH_LIFE = 0x9d
local function spec_life(spec)
  if not spec or string.byte(spec, 1) ~= SPEC_WITH_LIFE then return nil end
  -- The text is at most 85 bytes (five integers below 2^53): only the spec's tail is searched.
  local a, b, c, d, e = string.match(string.sub(spec, -90), 'L(%d+),(%d+),(%d+),(%d+),(%d+)$')
  if not a then return nil end
  return {tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e)}
end
