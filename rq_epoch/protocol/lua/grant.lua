-- grant: open the lease of a job's execution, stamped with the server's epoch.
--
-- Called in the same transaction as RQ's own bookkeeping when a worker starts an
-- execution. The deadline and the stamp are written together, so a granted lease
-- never exists without a stamp.
--
-- One lease per job: its member is the job id, and the job's `lease_execution` names the
-- execution that holds it. A grant to a newer execution of the same job replaces the
-- older lease (the older execution's heartbeat and commit then find another holder).
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- KEYS[3]  optional: RQ's intermediate list of the queue (<prefix>:queue:<queue>:intermediate)
-- KEYS[4]  optional: first sightings of jobs in that list (<prefix>:epoch:limbo:<queue>)
-- KEYS[5]  optional: RQ's StartedJobRegistry of the queue (<prefix>:wip:<queue>)
-- KEYS[6]  optional: RQ's list of the queue (<prefix>:queue:<queue>)
-- ARGV[1]  job id (the lease member)
-- ARGV[2]  lease length in seconds (deadline = server TIME + this)
-- ARGV[3]  execution id
-- ARGV[4]  optional: RQ key prefix ("rq"); with it, the script notes that this server is
--          alive as primary (note_alive in _epoch.lua, at most once a second per server)
--
-- Returns {1, run_id, deadline} when granted; {0, run_id, 0} when the job hash is gone,
-- or has no `created_at` (what is left of a deleted job after a late write of one field;
-- nothing is written then). Errors with EPOCH_UNAVAILABLE when the server yields no
-- valid run_id; nothing is written then either.
--
-- With KEYS[3] and KEYS[4], the job's entry in the intermediate list (left there by the
-- take, or by RQ's BLMOVE on a single queue) and its first sighting by a sweep are
-- removed: once the lease exists, the lease is what the sweep recovers. When the entry is
-- not there and KEYS[6] is given, the job is removed from its queue instead: this server
-- never saw the take (a failover lost it, and the worker followed the new primary before
-- it granted), so the job still waits in its queue here, where another worker would take
-- it and run it beside this execution. A lease exists only for a job that no list holds.
--
-- With KEYS[5], the registry entry "<job_id>:<execution_id>" of the execution whose lease
-- this grant replaces (the job's `lease_execution` before it) is removed: that execution
-- no longer holds the job, its outcome will be refused, and no sweep will judge a lease
-- of it to drop the entry, which RQ keeps with no expiry.
--
-- A job that the sweep dead-lettered carries `stall_dead`; when it is granted again
-- (someone requeued it by hand, with any tool) its stall budget starts afresh.
--
-- In Python the reply is read by rq_epoch/verbs.py (grant, GrantReply).

-- @include _epoch.lua

local leases_key, job_key, intermediate_key, limbo_key, wip_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local queue_key = KEYS[6]
local job_id, execution = ARGV[1], ARGV[3]

local run_id, uptime, err = current_epoch()
if err then return redis.error_reply(err) end

-- The execution that held the job before and the mark of a dead letter, in one read with
-- `created_at`, which RQ writes into every job hash it saves: without it, the job is gone.
local held = rcall('HMGET', job_key, 'lease_execution', 'stall_dead', 'created_at')
if not held[3] then
  return {0, run_id, '0'}
end
if wip_key then
  local previous = held[1]
  if previous and previous ~= execution then rcall('ZREM', wip_key, job_id .. ':' .. previous) end
end
local now = server_now()
if ARGV[4] then note_alive(ARGV[4], run_id, uptime, now) end
local deadline = now + tonumber(ARGV[2])
rcall('ZADD', leases_key, deadline, job_id)
if held[2] then
  rcall('HSET', job_key, 'lease_epoch', run_id, 'lease_execution', execution, 'stalled', 0)
  rcall('HDEL', job_key, 'stall_dead', 'stall_epochs')
else
  rcall('HSET', job_key, 'lease_epoch', run_id, 'lease_execution', execution)
end
if limbo_key then
  local taken = rcall('LREM', intermediate_key, 1, job_id)
  rcall('HDEL', limbo_key, job_id)
  -- (The queue is scanned only when the take's entry is missing: the rare case.)
  if taken == 0 and queue_key then rcall('LREM', queue_key, 1, job_id) end
end
return {1, run_id, tostring(deadline)}
