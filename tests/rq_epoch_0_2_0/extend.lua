-- extend: push a lease's deadline forward and re-stamp it (every worker heartbeat).
--
-- Only a lease that still exists is extended: a heartbeat that arrives after a sweep
-- took the lease must not bring it back. Re-stamping moves the lease to the server
-- process that is running now, so a worker that rode out a restart reclaims its lease.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:leases:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- ARGV[1]  lease member, "<job_id>:<execution_id>"
-- ARGV[2]  lease length in seconds (deadline = server TIME + this)
--
-- Returns {1, run_id, deadline} when extended; {0, run_id, 0} when the lease is gone.
-- Errors with EPOCH_UNAVAILABLE when the server yields no valid run_id.

-- @include _epoch.lua

local run_id, _, err = current_epoch()
if err then return redis.error_reply(err) end

if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {0, run_id, '0'}
end

local deadline = server_now() + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'lease_epoch', run_id)
end
return {1, run_id, tostring(deadline)}
