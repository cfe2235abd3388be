-- commit: write an execution's outcome only while that execution still holds the lease.
--
-- The fence of the lease epoch: once a sweep has taken a lease, or a newer execution
-- has been granted one, the old execution's outcome (success, failure, retry, stop, a
-- work-horse's death) must not land. The worker queues RQ's own bookkeeping for the
-- outcome as usual; instead of sending those commands, it sends them here as arguments,
-- and this script runs them only if, at this moment, the lease member still exists and
-- the job's `lease_execution` is this execution. Check and write are one atomic step.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:leases:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- KEYS[3]  per-queue counters                (<prefix>:epoch:stats:<queue>)
-- KEYS[4]  record of a taken lease           (<prefix>:epoch:taken:<job_id>:<execution_id>)
-- ARGV[1]  lease member, "<job_id>:<execution_id>"
-- ARGV[2]  execution id
-- ARGV[3]  "1" to count a refusal, "0" not to (a check made before a callback runs)
-- ARGV[4]  number of commands that follow (0: only check the fence)
-- ARGV[5...] the commands, each as its argument count followed by its arguments
--
-- The commands touch RQ's keys (job, registries, results, queues) that are not listed in
-- KEYS; RQ itself does not run on Redis Cluster, and neither does this script.
--
-- Returns {1, reply, reply, ...} (one reply per command, an error reply where a command
-- failed, as in MULTI/EXEC) when the fence holds. When it does not, nothing is written
-- but the refusal counters (job field `stale_outcomes`, counter `refused` of the queue,
-- only when ARGV[3] is "1" and there is evidence of a newer holder), and it returns
-- {0, reason, detail, holder} where holder is the job's `lease_execution` now ('' if none):
--   taken       a sweep took the lease; detail is its verdict
--   superseded  a newer execution holds the job; detail is that execution's id
--   gone        the lease is gone with no sign of a newer holder (the execution's own
--               earlier commit landed, or the job was cancelled or deleted)

local member, execution = ARGV[1], ARGV[2]
local count_refusal = ARGV[3] == '1'
local ncommands = tonumber(ARGV[4])

local holder = redis.call('HGET', KEYS[2], 'lease_execution')
if holder == execution and redis.call('ZSCORE', KEYS[1], member) then
  local replies = {1}
  local i = 5
  for _ = 1, ncommands do
    local argc = tonumber(ARGV[i])
    local reply = redis.pcall(unpack(ARGV, i + 1, i + argc))
    replies[#replies + 1] = reply
    i = i + argc + 1
  end
  return replies
end

local reason, detail = 'gone', ''
local taken = redis.call('GET', KEYS[4])
if taken then
  reason, detail = 'taken', taken
elseif holder and holder ~= execution then
  reason, detail = 'superseded', holder
end
if count_refusal and reason ~= 'gone' then
  if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HINCRBY', KEYS[2], 'stale_outcomes', 1) end
  redis.call('HINCRBY', KEYS[3], 'refused', 1)
end
return {0, reason, detail, holder or ''}
