-- extend: push a lease's deadline forward and re-stamp it (every worker heartbeat).
--
-- Only a lease that this execution still holds is extended: the job's lease member
-- exists and its `lease_execution` is this execution. A heartbeat that arrives after a
-- sweep took the lease must not bring it back, nor may an execution whose lease a newer
-- grant of the same job replaced keep that newer lease alive. Re-stamping moves the lease
-- to the server process that is running now, so a worker that rode out a restart reclaims its lease.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- KEYS[3]  optional: RQ's started registry of the queue (<prefix>:wip:<queue>); the
--          execution's entry there ("<job_id>:<execution_id>"), if it still exists, gets
--          RQ's "no expiry" score again (what RQ's heartbeat writes there, done here to
--          save the heartbeat a command)
-- ARGV[1]  job id (the lease member)
-- ARGV[2]  lease length in seconds (deadline = server TIME + this)
-- ARGV[3]  execution id
-- ARGV[4]  optional: RQ key prefix ("rq"); with it, the script notes that this server is
--          alive as primary in <prefix>:epoch:alive (note_alive in _epoch.lua: at most once
--          a second per server, the sweep's proof that a lease ran out before a restart)
--
-- Returns {1, run_id, deadline, ''} when extended. When the lease is not this
-- execution's (gone, or held by a newer execution) it returns
-- {0, run_id, 0, verdict}: verdict is what the sweep that took this execution's lease
-- decided (the job's field "taken:<execution_id>", written by the sweep), or '' when no
-- sweep took it (the execution's own outcome ended it, or a newer grant replaced it), so the
-- worker can tell the two apart by this execution's identity alone.
-- Errors with EPOCH_UNAVAILABLE when the server yields no valid run_id (nothing is
-- written then).
--
-- In Python the reply is read by rq_epoch/verbs.py (extend, ExtendReply: also when the
-- call rides in a heartbeat's pipeline).

-- @include _epoch.lua

local leases_key, job_key, wip_key = KEYS[1], KEYS[2], KEYS[3]
local job_id, execution = ARGV[1], ARGV[3]

local run_id, uptime, err = current_epoch()
if err then return redis.error_reply(err) end

local function lost()
  return {0, run_id, '0', rcall('HGET', job_key, 'taken:' .. execution) or ''}
end

-- The holder and the stamp in one read; a job hash that is gone has no holder.
local held = rcall('HMGET', job_key, 'lease_execution', 'lease_epoch')
if held[1] ~= execution then return lost() end

-- ZADD XX CH answers 0 for a lease that is gone, or (hardly ever) for one whose deadline
-- did not change: only then is ZSCORE needed to tell the two apart.
local now = server_now()
if ARGV[4] then note_alive(ARGV[4], run_id, uptime, now) end
local deadline = now + tonumber(ARGV[2])
if rcall('ZADD', leases_key, 'XX', 'CH', deadline, job_id) == 0
    and not rcall('ZSCORE', leases_key, job_id) then
  return lost()
end

if wip_key then
  rcall('ZADD', wip_key, 'XX', '+inf', job_id .. ':' .. execution)
end

-- The stamp is written only when it names another process (or none): from the second
-- heartbeat on it names this one already, and a read costs less than a write, which is
-- also propagated to the AOF and the replicas.
if held[2] ~= run_id then
  rcall('HSET', job_key, 'lease_epoch', run_id)
end
return {1, run_id, tostring(deadline), ''}
