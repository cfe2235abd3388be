-- handback: give a running job back to the front of its queue, uncounted, because its
-- worker was told to stop (a deploy) and stopped the work-horse.
--
-- The fence of the lease: only an execution that still holds its lease hands its job
-- back. If a sweep took the lease, or a newer execution holds the job, or the execution's
-- own outcome landed already (its commit removed the lease: the job finished just before
-- the worker stopped it), nothing is written and the hand-back is refused. Check and
-- write are one atomic step, so of a commit and a hand-back of the same execution exactly
-- one wins.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- KEYS[3]  RQ's StartedJobRegistry           (<prefix>:wip:<queue>)
-- KEYS[4]  per-queue counters                (<prefix>:epoch:stats:<queue>)
-- KEYS[5]  the job's queue                   (<prefix>:queue:<queue>)
-- KEYS[6]  RQ's intermediate list            (<prefix>:queue:<queue>:intermediate)
-- KEYS[7]  RQ's set of queues                (<prefix>:queues)
-- KEYS[8]  RQ's execution record             (<prefix>:execution:<job_id>:<execution_id>)
-- KEYS[9]  RQ's executions of the job        (<prefix>:executions:<job_id>)
-- ARGV[1]  job id (the lease member)
-- ARGV[2]  execution id
-- ARGV[3]  RQ key prefix ("rq"): the worker's executions set is
--          <prefix>:worker:<worker_name>:executions (worker_name read from KEYS[8])
--
-- When the execution holds its lease and the job is still started under it (or still
-- queued: granted, its work-horse stopped before it started): the lease, RQ's registry
-- entry and RQ's records of the execution are removed; the job gets status queued,
-- `handed_back` + 1 (its history), `taken:<execution_id>` = handed_back (so that a late
-- commit or heartbeat of this execution learns why its lease is gone), its stop mark is
-- removed; it is pushed to the front of its queue (taken out of the intermediate list) and
-- the queue registered; the queue's counter `handed_back` + 1. `stalled` is not touched.
--
-- Returns {1, now} when handed back; {0, reason, detail, holder} when refused, with
-- holder the job's `lease_execution` now ('' if none):
--   taken       a sweep took the lease; detail is its verdict
--   superseded  a newer execution holds the job; detail is its id
--   gone        the execution's own outcome landed (its lease is gone, or the job is no
--               longer started), or the job was deleted; detail 'handed_back' when it is
--               this execution's own earlier hand-back that landed (a call sent again)
-- A refusal on evidence of another holder (taken, superseded) is counted on the queue
-- (`refused`), as a refused outcome is.
--
-- In Python the reply is read by rq_epoch/verbs.py (hand_back, HandBackReply).

-- @include _epoch.lua

local leases_key, job_key, wip_key, stats_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue_key, intermediate_key, queues_key = KEYS[5], KEYS[6], KEYS[7]
local execution_key, job_executions_key = KEYS[8], KEYS[9]
local job_id, execution, prefix = ARGV[1], ARGV[2], ARGV[3]

local f = rcall('HMGET', job_key, 'lease_execution', 'status', 'taken:' .. execution)
local holder, status, taken = f[1], f[2], f[3]
local leased = holder == execution and rcall('ZSCORE', leases_key, job_id)
if not (leased and (status == 'started' or status == 'queued')) then
  local reason, detail = 'gone', ''
  if taken == 'handed_back' then
    detail = taken  -- this execution's own hand-back landed already (a retry)
  elseif taken then
    reason, detail = 'taken', taken
  elseif holder and holder ~= execution then
    reason, detail = 'superseded', holder
  end
  if reason ~= 'gone' then rcall('HINCRBY', stats_key, 'refused', 1) end
  return {0, reason, detail, holder or ''}
end

rcall('ZREM', leases_key, job_id)
rcall('ZREM', wip_key, job_id .. ':' .. execution)
local worker_name = rcall('HGET', execution_key, 'worker_name')
if worker_name and worker_name ~= '' then
  rcall('SREM', prefix .. ':worker:' .. worker_name .. ':executions', job_id .. ':' .. execution)
end
rcall('DEL', execution_key)
rcall('ZREM', job_executions_key, execution)
rcall('HSET', job_key, 'status', 'queued', 'started_at', '', 'taken:' .. execution, 'handed_back')
rcall('HINCRBY', job_key, 'handed_back', 1)
rcall('HDEL', job_key, 'stop_mark')
rcall('LREM', intermediate_key, 0, job_id)
rcall('LREM', queue_key, 0, job_id)
rcall('LPUSH', queue_key, job_id)
rcall('SADD', queues_key, queue_key)
rcall('HINCRBY', stats_key, 'handed_back', 1)
return {1, string.format('%.6f', server_now())}
