-- extend: push a lease's deadline forward and re-stamp it (every worker heartbeat).
--
-- Only a lease that this execution still holds is extended: the job's lease member
-- exists and its `lease_execution` is this execution. A heartbeat that arrives after a
-- sweep took the lease must not bring it back, nor may an execution whose lease a newer
-- grant of the same job replaced keep that newer lease alive. Re-stamping moves the lease to the server
-- process that is running now, so a worker that rode out a restart reclaims its lease.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- ARGV[1]  job id (the lease member)
-- ARGV[2]  lease length in seconds (deadline = server TIME + this)
-- ARGV[3]  execution id
--
-- Returns {1, run_id, deadline, ''} when extended. When the lease is not this
-- execution's (gone, or held by a newer execution) it returns
-- {0, run_id, 0, verdict}: verdict is what the sweep that took this execution's lease
-- decided (the job's field "taken:<execution_id>", written by the sweep), or '' when no
-- sweep took it (the execution's own outcome ended it, or a newer grant replaced it), so the
-- worker can tell the two apart by this execution's identity alone.
-- Errors with EPOCH_UNAVAILABLE when the server yields no valid run_id.

-- @include _epoch.lua

local leases_key, job_key = KEYS[1], KEYS[2]
local job_id, execution = ARGV[1], ARGV[3]

local run_id, _, err = current_epoch()
if err then return redis.error_reply(err) end

if redis.call('HGET', job_key, 'lease_execution') ~= execution or not redis.call('ZSCORE', leases_key, job_id) then
  return {0, run_id, '0', redis.call('HGET', job_key, 'taken:' .. execution) or ''}
end

local deadline = server_now() + tonumber(ARGV[2])
redis.call('ZADD', leases_key, 'XX', deadline, job_id)
redis.call('HSET', job_key, 'lease_epoch', run_id)
return {1, run_id, tostring(deadline), ''}
