-- commit: write an execution's outcome unless a newer execution or a sweep took over.
--
-- The fence of the lease epoch: once a sweep has taken a lease, or a newer execution
-- has been granted one, the old execution's outcome (success, failure, retry, stop, a
-- work-horse's death) must not land. The worker queues RQ's own bookkeeping for the
-- outcome as usual; instead of sending those commands, it sends them here as arguments,
-- and this script runs them only if, at this moment, the execution still holds its lease
-- (the job's lease member exists and the job's `lease_execution` is this execution).
-- Check and write are one atomic step.
--
-- An execution that holds no lease here (the grant found the job gone, or a failover or
-- restart lost its take and grant: the server it now talks to never saw them) is refused
-- on evidence that someone else has the job: a sweep's record of taking it, or a newer
-- holder. It is refused too while the job can still be taken, from its queue (KEYS[5]) or
-- the queue's intermediate list (KEYS[6]): the job would run again and end with a second
-- outcome, so this one does not land and the job runs again, once. Otherwise its commands
-- run, and a record that it committed is left (KEYS[4]), so that the same commit sent
-- again (the worker retries an outcome after a connection error, not knowing whether the
-- first attempt landed) is refused as 'gone' instead of writing twice. A leased execution
-- needs no such record: its first commit removes the job's lease member, which the second
-- finds missing.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- KEYS[3]  per-queue counters                (<prefix>:epoch:stats:<queue>)
-- KEYS[4]  record of an unleased commit      (<prefix>:epoch:committed:<job_id>:<execution_id>)
-- KEYS[5]  RQ's list of the job's queue      (<prefix>:queue:<queue>)
-- KEYS[6]  RQ's intermediate list of it      (<prefix>:queue:<queue>:intermediate)
-- ARGV[1]  job id (the lease member)
-- ARGV[2]  execution id
-- ARGV[3]  "1" to commit (refusals are counted), "0" only to check (before a callback runs)
-- ARGV[4]  number of commands that follow (0: only check the fence)
-- ARGV[5]  seconds to keep the record of an unleased commit
-- ARGV[6...] the commands, each as its argument count followed by its arguments
--
-- The commands touch RQ's keys (job, registries, results, queues) that are not listed in
-- KEYS; RQ itself does not run on Redis Cluster, and neither does this script.
--
-- Returns {1, reply, reply, ...} (one reply per command, an error reply where a command
-- failed, as in MULTI/EXEC) when the execution holds its lease; {2, reply, ...} when it
-- holds none, nobody took over and the job is in none of its lists (with no commands, a commit check: the caller must
-- write the record of KEYS[4] in the same transaction as its commands). When the fence
-- does not hold, nothing is written but the refusal counters (job field `stale_outcomes`,
-- counter `refused` of the queue, only when ARGV[3] is "1" and there is evidence of a
-- newer holder), and it returns {0, reason, detail, holder} where holder is the job's
-- `lease_execution` now ('' if none):
--   taken       a sweep took the lease; detail is its verdict (the job's field
--               "taken:<execution_id>", written by the sweep)
--   superseded  a newer execution holds the job; detail is that execution's id
--   queued      the execution holds no lease here and the job waits in its queue or the
--               intermediate list (a failover or restart lost the take and the grant); detail
--               is the key of the list that holds it
--   gone        the execution's own earlier commit landed (its lease, or the job, is gone,
--               or the record of KEYS[4] exists), or the job was cancelled or deleted
--
-- In Python the reply is read by rq_epoch/verbs.py (commit, CommitReply: also when the
-- call replaces an outcome's transaction, see rq_epoch/fence.py).

local rcall, rpcall = redis.call, redis.pcall  -- read from locals, not the global table

local leases_key, job_key, stats_key, committed_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue_key, intermediate_key = KEYS[5], KEYS[6]
local job_id, execution = ARGV[1], ARGV[2]
local committing = ARGV[3] == '1'
local ncommands = tonumber(ARGV[4])

local function run(status)
  local replies = {status}
  local i = 6
  for _ = 1, ncommands do
    local argc = tonumber(ARGV[i])
    local reply = rpcall(unpack(ARGV, i + 1, i + argc))
    replies[#replies + 1] = reply
    i = i + argc + 1
  end
  return replies
end

local holder = rcall('HGET', job_key, 'lease_execution')
if holder == execution and rcall('ZSCORE', leases_key, job_id) then
  return run(1)
end

local reason, detail = nil, ''
local taken = rcall('HGET', job_key, 'taken:' .. execution)
if taken then
  reason, detail = 'taken', taken
elseif holder and holder ~= execution then
  reason, detail = 'superseded', holder
elseif holder == execution or rcall('EXISTS', job_key) == 0 or rcall('EXISTS', committed_key) == 1 then
  reason = 'gone'
end

if not reason then
  -- Never granted here, and nobody took over. While the job can still be taken, its
  -- outcome must not land: the job would run again and end with two outcomes.
  for _, list_key in ipairs({queue_key, intermediate_key}) do
    if rcall('LPOS', list_key, job_id) then
      reason, detail = 'queued', list_key
      break
    end
  end
end

if not reason then
  -- Never granted, nobody took over, and the job can be taken from nowhere: it lands.
  if committing and ncommands > 0 then
    rcall('SET', committed_key, '1', 'EX', tonumber(ARGV[5]))
  end
  return run(2)
end

if committing and reason ~= 'gone' then
  if rcall('EXISTS', job_key) == 1 then rcall('HINCRBY', job_key, 'stale_outcomes', 1) end
  rcall('HINCRBY', stats_key, 'refused', 1)
end
return {0, reason, detail, holder or ''}
