-- stopmark: mark an execution's lease as stopping, because its worker was told to stop.
--
-- A worker told to stop (a deploy: SIGTERM, SIGINT, RQ's shutdown command) writes this mark
-- at once, before it waits for its job. If the worker is then killed before it could hand
-- the job back (a supervisor's SIGKILL after its grace), the sweep finds the mark: a lease
-- that ran out within the stop window after the mark is requeued uncounted (verdict
-- `stopping`, see sweep.lua), instead of being counted as a worker death.
--
-- Only a lease that this execution still holds and that has not run out yet is marked: the
-- job's lease member exists with a deadline at or after the server's TIME, and its
-- `lease_execution` is this execution. A lease already expired or taken is left alone.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>)
-- KEYS[2]  job hash                          (<prefix>:job:<job_id>)
-- ARGV[1]  job id (the lease member)
-- ARGV[2]  execution id
-- ARGV[3]  the stop window in seconds (the worker's shutdown timeout plus one lease length)
--
-- Writes the job's field `stop_mark` = "<execution_id> <marked_at> <until>": the server's
-- TIME now and that time plus the window.
--
-- Returns {1, marked_at, window_end} when marked; {0, now, 0} when the lease is not this
-- execution's or has run out already (nothing is written then).
--
-- In Python the reply is read by rq_epoch/verbs.py (stop_mark, StopMarkReply).

-- @include _epoch.lua

local leases_key, job_key = KEYS[1], KEYS[2]
local job_id, execution = ARGV[1], ARGV[2]
local now = server_now()

local deadline = tonumber(rcall('ZSCORE', leases_key, job_id))
if rcall('HGET', job_key, 'lease_execution') ~= execution or not deadline or deadline < now then
  return {0, string.format('%.6f', now), '0'}
end
local marked, window_end = string.format('%.6f', now), string.format('%.6f', now + tonumber(ARGV[3]))
rcall('HSET', job_key, 'stop_mark', execution .. ' ' .. marked .. ' ' .. window_end)
return {1, marked, window_end}
