-- rescue: requeue jobs stranded in RQ's intermediate list of one queue.
--
-- A job in RQ's intermediate list (<prefix>:queue:<queue>:intermediate) that is still
-- "queued" and has no live lease was taken by a worker that died before starting it (the
-- take script, or RQ's own BLMOVE, put it there; the grant removes it). It never ran, so
-- it did not stall: once it has been seen there for ARGV[5] seconds it is requeued
-- uncounted (verdict exempt; its record's member is the bare job id). Entries of jobs that
-- are gone are ghosts, of keys that are not hashes corrupt; entries of jobs that already
-- ended are dropped silently.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>, member the job id)
-- KEYS[2]  RQ's StartedJobRegistry           (<prefix>:wip:<queue>)
-- KEYS[3]  first sightings of jobs stuck in the intermediate list (<prefix>:epoch:limbo:<queue>)
-- KEYS[4]  per-queue verdict counters        (<prefix>:epoch:stats:<queue>)
-- KEYS[5]  leases of rq-epoch 0.2.0 workers  (<prefix>:epoch:leases:<queue>, member "<job_id>:<execution_id>")
-- ARGV[1]  RQ key prefix ("rq")
-- ARGV[2]  queue name
-- ARGV[3]  batch: at most this many entries of the intermediate list are read
-- ARGV[4]  default max_stalled (reported only)
-- ARGV[5]  seconds a job may sit in the intermediate list, taken but never granted
-- ARGV[6]  "1" for a dry run: verdicts are computed, nothing is written
--
-- Keys derived from ARGV[1] (prefix), ARGV[2] (queue) and each job id:
--   <prefix>:queue:<queue>                  the queue (read with LPOS; requeued jobs pushed)
--   <prefix>:queue:<queue>:intermediate     RQ's intermediate list (read; entries removed)
--   <prefix>:job:<job_id>                   the job hash (read; requeued)
--   <prefix>:queues                         RQ's set of queues (the queue registered)
--   <prefix>:epoch:primaries                when this process became primary (_epoch.lua)
--
-- Like the sweep, a server that is not a primary, or an isolated primary, judges nothing.
-- A job has a live lease when its lease member is in KEYS[1], or its `lease_execution`
-- has an entry in KEYS[5] or KEYS[2].
--
-- Returns the reply of _sweep.lua (more, left_leases, left_stock and left_legacy are 0).
--
-- In Python the reply is read by rq_epoch/verbs.py (rescue, SweepReply).

-- @include _epoch.lua
-- @include _sweep.lua

local leases_key, wip_key, limbo_key, stats_key, legacy_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local run_id, uptime, err = current_epoch()
if err then return redis.error_reply(err) end

local prefix, queue = ARGV[1], ARGV[2]
local batch, default_max, limbo_timeout = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local dry = ARGV[6] == '1'
local now = server_now()
local primary, judges = judging_primary(run_id, uptime, now, prefix, dry)
if not judges then return reply(run_id, uptime, now, primary, 0, 0, 0, 0) end

local queue_key = prefix .. ':queue:' .. queue
local intermediate = queue_key .. ':intermediate'

local function forget(job_id)
  if not dry then
    rcall('LREM', intermediate, 0, job_id)
    rcall('HDEL', limbo_key, job_id)
  end
end

for _, job_id in ipairs(rcall('LRANGE', intermediate, 0, batch - 1)) do
  local job_key = prefix .. ':job:' .. job_id
  local kind = rcall('TYPE', job_key)['ok']
  if kind ~= 'hash' then
    forget(job_id)
    if kind == 'none' then record(job_id, 'ghost', 0, 0, '', dry) else record(job_id, 'corrupt', 0, 0, '', dry) end
  else
    local f = rcall('HMGET', job_key, 'status', 'lease_execution', 'stalled', 'max_stalled', 'lease_epoch')
    local status, execution = f[1], f[2]
    local live = false
    if execution then
      local member = job_id .. ':' .. execution
      live = rcall('ZSCORE', leases_key, job_id) or rcall('ZSCORE', legacy_key, member)
        or rcall('ZSCORE', wip_key, member)
    end
    if status == 'queued' and not live and not rcall('LPOS', queue_key, job_id) then
      local first = rcall('HGET', limbo_key, job_id)
      if not first then
        if not dry then rcall('HSET', limbo_key, job_id, tostring(now)) end
      elseif now - tonumber(first) >= limbo_timeout then
        if not dry then
          rcall('HDEL', limbo_key, job_id)
          requeue(prefix, queue_key, job_key, job_id, true, false)
          rcall('HINCRBY', job_key, 'exempt_recoveries', 1)
        end
        record(job_id, 'exempt', count_of(f[3], 0, 0), count_of(f[4], 1, default_max), f[5], dry)
      end
    elseif status == 'finished' or status == 'failed' or status == 'stopped' or status == 'canceled' then
      forget(job_id)
    elseif not dry then
      rcall('HDEL', limbo_key, job_id)
    end
  end
end
if not dry and rcall('HLEN', limbo_key) > 4 * batch then rcall('DEL', limbo_key) end
if not dry then count_verdicts(stats_key) end

return reply(run_id, uptime, now, primary, 0, 0, 0, 0)
