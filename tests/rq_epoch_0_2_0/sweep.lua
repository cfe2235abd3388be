-- sweep: give each expired lease of one queue exactly one verdict.
--
-- Runs atomically per call, so any number of sweepers (every worker's maintenance and
-- any number of cron jobs) can run at once: a lease is judged by exactly one of them.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:leases:<queue>)
-- KEYS[2]  RQ's StartedJobRegistry           (<prefix>:wip:<queue>)
-- KEYS[3]  dead letters awaiting their Python side effects (<prefix>:epoch:finishing)
-- KEYS[4]  per-queue verdict counters        (<prefix>:epoch:stats:<queue>)
-- KEYS[5]  first sightings of jobs stuck in RQ's intermediate queue (<prefix>:epoch:limbo:<queue>)
-- ARGV[1]  RQ key prefix ("rq"): job, execution and queue keys are derived from it
-- ARGV[2]  queue name (used when a job has no origin)
-- ARGV[3]  batch: at most this many entries are read from each sorted set
-- ARGV[4]  default max_stalled (a job's own max_stalled field wins)
-- ARGV[5]  restart grace in seconds: uncounted leases wait until the server is this old
-- ARGV[6]  failure TTL in seconds for jobs without their own failure_ttl
-- ARGV[7]  "1" for a dry run: verdicts are computed, nothing is written
-- ARGV[8]  offset into the expired entries (dry runs page with it; 0 otherwise)
-- ARGV[9]  seconds a job may sit in RQ's intermediate queue, taken by a worker but never
--          granted, before it is requeued uncounted (0: leave the intermediate queue alone)
--
-- Expired entries are read from two places: rq-epoch's leases (deadline <= TIME), and
-- RQ's StartedJobRegistry entries with a finite expired score, which only stock workers
-- write (rq-epoch gives its own entries the score +inf). The latter carry no stamp of
-- rq-epoch's and are never counted.
--
-- Verdicts (DESIGN.md):
--   ghost      job hash gone                      -> entry removed
--   corrupt    member malformed / job not a hash  -> entry removed, foreign key untouched
--   settled    job no longer started              -> entry removed, job untouched
--   exempt     stamp missing or another process   -> requeued at front, stalled unchanged
--   recovered  stamp is this process, budget left -> stalled + 1, requeued at front
--   dead       stamp is this process, budget gone -> stalled + 1, failed, awaiting finish
--   deferred   uncounted, but the server is younger than the grace: left for later
--
-- A job in RQ's intermediate queue (<prefix>:queue:<queue>:intermediate) that is still
-- "queued" and has no live lease was taken by a worker that died before starting it. It
-- never ran, so it did not stall: once it has been seen there for ARGV[9] seconds it is
-- requeued uncounted (verdict exempt; its member is the bare job id). Entries of jobs
-- that are gone are ghosts; entries of jobs that already ended are dropped silently.
--
-- Returns {run_id, uptime, now, more, n, <n records of 7 fields>} where a record is
-- {member, job_id, verdict, stalled, max_stalled, lease_epoch, origin}.

-- @include _epoch.lua

local run_id, uptime, err = current_epoch()
if err then return redis.error_reply(err) end

local prefix = ARGV[1]
local default_queue = ARGV[2]
local batch = tonumber(ARGV[3])
local default_max = tonumber(ARGV[4])
local grace = tonumber(ARGV[5])
local default_failure_ttl = tonumber(ARGV[6])
local dry = ARGV[7] == '1'
local offset = tonumber(ARGV[8])
local limbo_timeout = tonumber(ARGV[9]) or 0
local now = server_now()

local out = {}
local n = 0
-- Verdicts of this call, added to the counters once at the end (one HINCRBY per verdict).
local tally = {}
-- Queues already registered in <prefix>:queues by this call.
local registered = {}

local function record(member, job_id, verdict, stalled, max_stalled, epoch, origin)
  n = n + 1
  local row = {member, job_id or '', verdict, tostring(stalled or 0), tostring(max_stalled or 0),
               epoch or '', origin or ''}
  for i = 1, 7 do out[#out + 1] = row[i] end
  if not dry and verdict ~= 'deferred' then
    tally[verdict] = (tally[verdict] or 0) + 1
  end
end

-- Forget the lease entry and RQ's records of the execution.
local function drop(member, job_id, exec_id)
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
  if job_id and exec_id then
    local execution_key = prefix .. ':execution:' .. member
    local worker_name = redis.call('HGET', execution_key, 'worker_name')
    redis.call('DEL', execution_key)
    redis.call('ZREM', prefix .. ':executions:' .. job_id, exec_id)
    if worker_name and worker_name ~= '' then
      redis.call('SREM', prefix .. ':worker:' .. worker_name .. ':executions', member)
    end
  end
end

-- ... is the job's other fields to write in the same HSET.
local function requeue(job_key, job_id, origin, ...)
  local queue_key = prefix .. ':queue:' .. origin
  redis.call('HSET', job_key, 'status', 'queued', 'started_at', '', ...)
  redis.call('LREM', queue_key .. ':intermediate', 0, job_id)
  redis.call('LPUSH', queue_key, job_id)
  if not registered[queue_key] then
    redis.call('SADD', prefix .. ':queues', queue_key)
    registered[queue_key] = true
  end
end

local function bury(job_key, job_id, origin, failure_ttl, stalled, epochs)
  local ttl = tonumber(failure_ttl)
  if ttl == nil or ttl <= 0 then ttl = default_failure_ttl end
  redis.call('HSET', job_key, 'status', 'failed', 'stall_dead', '1', 'stalled', stalled, 'stall_epochs', epochs)
  redis.call('LREM', prefix .. ':queue:' .. origin .. ':intermediate', 0, job_id)
  redis.call('ZADD', prefix .. ':failed:' .. origin, now + ttl, job_id)
  redis.call('ZADD', KEYS[3], 0, origin .. '|' .. job_id)
end

local function judge(member, stock)
  local job_id, exec_id = string.match(member, '^([^:]+):([^:]+)$')
  if not job_id then
    if not dry then drop(member, nil, nil) end
    return record(member, nil, 'corrupt')
  end
  local job_key = prefix .. ':job:' .. job_id
  -- One read for the common case; the key's type is only asked when the read fails.
  local f = redis.pcall('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled',
                        'origin', 'lease_execution', 'failure_ttl', 'exempt_recoveries', 'stall_epochs')
  if f.err then
    if not dry then drop(member, nil, nil) end
    return record(member, job_id, 'corrupt')
  end
  if not f[1] and redis.call('EXISTS', job_key) == 0 then
    if not dry then drop(member, job_id, exec_id) end
    return record(member, job_id, 'ghost')
  end
  local status, epoch, lease_execution = f[1], f[2], f[6]
  local stalled = tonumber(f[3]) or 0
  local max_stalled = tonumber(f[4])
  if max_stalled == nil or max_stalled < 1 or max_stalled % 1 ~= 0 then max_stalled = default_max end
  local origin = f[5]
  if not origin or origin == '' then origin = default_queue end
  if stock then epoch = false end

  local never_started = false
  if status == 'started' then
    if not stock and lease_execution and lease_execution ~= exec_id then
      if not dry then drop(member, job_id, exec_id) end
      return record(member, job_id, 'settled', stalled, max_stalled, epoch, origin)
    end
  elseif status == 'queued' and not stock and lease_execution == exec_id
      and not redis.call('LPOS', prefix .. ':queue:' .. origin, job_id) then
    -- Granted, then the worker died before the job started: it never ran, so it did
    -- not stall. Requeued uncounted.
    never_started = true
  else
    if not dry then drop(member, job_id, exec_id) end
    return record(member, job_id, 'settled', stalled, max_stalled, epoch, origin)
  end

  local counted = (not never_started) and epoch and epoch == run_id
  if not counted then
    if uptime < grace then
      return record(member, job_id, 'deferred', stalled, max_stalled, epoch, origin)
    end
    if not dry then
      drop(member, job_id, exec_id)
      requeue(job_key, job_id, origin, 'exempt_recoveries', (tonumber(f[8]) or 0) + 1)
    end
    return record(member, job_id, 'exempt', stalled, max_stalled, epoch, origin)
  end

  stalled = stalled + 1
  local epochs = f[9]
  if epochs and epochs ~= '' then epochs = epochs .. ',' .. run_id else epochs = run_id end
  if stalled < max_stalled then
    if not dry then
      drop(member, job_id, exec_id)
      requeue(job_key, job_id, origin, 'stalled', stalled, 'stall_epochs', epochs)
    end
    return record(member, job_id, 'recovered', stalled, max_stalled, epoch, origin)
  end
  if not dry then
    drop(member, job_id, exec_id)
    bury(job_key, job_id, origin, f[7], stalled, epochs)
  end
  return record(member, job_id, 'dead', stalled, max_stalled, epoch, origin)
end

local leases = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', offset, batch)
for _, member in ipairs(leases) do judge(member, false) end

-- Stock workers' entries: finite, expired scores in RQ's registry, not managed by us.
local stock = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', offset, batch)
for _, member in ipairs(stock) do
  if not redis.call('ZSCORE', KEYS[1], member) then judge(member, true) end
end

-- Jobs taken from the queue by a worker that died before starting them.
local function rescue_intermediate()
  local queue_key = prefix .. ':queue:' .. default_queue
  local intermediate = queue_key .. ':intermediate'
  local ids = redis.call('LRANGE', intermediate, 0, batch - 1)
  for _, job_id in ipairs(ids) do
    local job_key = prefix .. ':job:' .. job_id
    local kind = redis.call('TYPE', job_key)['ok']
    if kind ~= 'hash' then
      if not dry then
        redis.call('LREM', intermediate, 0, job_id)
        redis.call('HDEL', KEYS[5], job_id)
      end
      if kind == 'none' then record(job_id, job_id, 'ghost') else record(job_id, job_id, 'corrupt') end
    else
      local f = redis.call('HMGET', job_key, 'status', 'lease_execution', 'stalled', 'max_stalled', 'lease_epoch')
      local status, execution = f[1], f[2]
      local live = false
      if execution then
        local member = job_id .. ':' .. execution
        live = redis.call('ZSCORE', KEYS[1], member) or redis.call('ZSCORE', KEYS[2], member)
      end
      if status == 'queued' and not live and not redis.call('LPOS', queue_key, job_id) then
        local first = redis.call('HGET', KEYS[5], job_id)
        if not first then
          if not dry then redis.call('HSET', KEYS[5], job_id, tostring(now)) end
        elseif now - tonumber(first) >= limbo_timeout then
          if not dry then
            redis.call('HDEL', KEYS[5], job_id)
            requeue(job_key, job_id, default_queue)
            redis.call('HINCRBY', job_key, 'exempt_recoveries', 1)
          end
          record(job_id, job_id, 'exempt', tonumber(f[3]) or 0, tonumber(f[4]) or default_max, f[5], default_queue)
        end
      elseif status == 'finished' or status == 'failed' or status == 'stopped' or status == 'canceled' then
        if not dry then
          redis.call('LREM', intermediate, 0, job_id)
          redis.call('HDEL', KEYS[5], job_id)
        end
      elseif not dry then
        redis.call('HDEL', KEYS[5], job_id)
      end
    end
  end
  if not dry and redis.call('HLEN', KEYS[5]) > 4 * batch then redis.call('DEL', KEYS[5]) end
end

if limbo_timeout > 0 and offset == 0 then rescue_intermediate() end

for verdict, count in pairs(tally) do redis.call('HINCRBY', KEYS[4], verdict, count) end

local more = 0
if #leases >= batch or #stock >= batch then more = 1 end
local head = {run_id, tostring(uptime), tostring(now), more, n}
for i = 1, #out do head[#head + 1] = out[i] end
return head
