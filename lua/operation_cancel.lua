--[[ operation_cancel: stop a background operation; its runner sees it at its next step
(operation_step.lua answers 'ended') and does no more.  What it did before stays done.

KEYS[1]  rsched:operation:<id>  HASH  (see operation_step.lua)
ARGV[1]  now_ms (0 = Redis TIME)
ARGV[2]  keep_ms: how long the ended operation's hash is kept
ARGV[3]  who cancels (recorded as cancelled_by)
Returns  {code, status}: 1 cancelled, 0 it had ended already (with its status), -2 no such
         operation
]]
--!include util
local op_key = KEYS[1]
local now, keep_ms, who = now_ms(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local status = redis.call('HGET', op_key, 'status')
if not status then return {-2, ''} end
if status ~= 'running' then return {0, status} end
redis.call('HSET', op_key, 'status', 'cancelled', 'ended_ms', now, 'updated_ms', now,
           'owner', '', 'cancelled_by', who)
redis.call('PEXPIRE', op_key, keep_ms)
return {1, 'cancelled'}
