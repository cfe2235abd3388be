-- grant: open the lease of a job's execution, stamped with the server's epoch.
--
-- Called in the same transaction as RQ's own bookkeeping when a worker starts an
-- execution. The deadline and the stamp are written together, so a granted lease
-- never exists without a stamp.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:leases:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- ARGV[1]  lease member, "<job_id>:<execution_id>"
-- ARGV[2]  lease length in seconds (deadline = server TIME + this)
-- ARGV[3]  execution id
--
-- Returns {1, run_id, deadline} when granted; {0, run_id, 0} when the job hash is gone
-- (nothing is written then). Errors with EPOCH_UNAVAILABLE when the server yields no
-- valid run_id; nothing is written then either.
--
-- A job that the sweep dead-lettered carries `stall_dead`; when it is granted again
-- (someone requeued it by hand, with any tool) its stall budget starts afresh.

-- @include _epoch.lua

local run_id, _, err = current_epoch()
if err then return redis.error_reply(err) end

if redis.call('EXISTS', KEYS[2]) == 0 then
  return {0, run_id, '0'}
end

local deadline = server_now() + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
redis.call('HSET', KEYS[2], 'lease_epoch', run_id, 'lease_execution', ARGV[3])
if redis.call('HEXISTS', KEYS[2], 'stall_dead') == 1 then
  redis.call('HSET', KEYS[2], 'stalled', 0)
  redis.call('HDEL', KEYS[2], 'stall_dead', 'stall_epochs')
end
return {1, run_id, tostring(deadline)}
