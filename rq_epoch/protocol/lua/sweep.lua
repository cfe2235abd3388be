-- sweep: give each expired lease of one queue exactly one verdict.
--
-- Runs atomically per call, so any number of sweepers (every worker's maintenance and
-- any number of cron jobs) can run at once: a lease is judged by exactly one of them.
--
-- KEYS[1]  leases sorted set of the queue   (<prefix>:epoch:lease:<queue>, member the job id)
-- KEYS[2]  RQ's StartedJobRegistry           (<prefix>:wip:<queue>)
-- KEYS[3]  dead letters awaiting their Python side effects (<prefix>:epoch:finishing)
-- KEYS[4]  per-queue verdict counters, and last_sweep: server TIME of the last call (<prefix>:epoch:stats:<queue>)
-- KEYS[5]  leases of rq-epoch 0.2.0 workers  (<prefix>:epoch:leases:<queue>, member "<job_id>:<execution_id>")
-- ARGV[1]  RQ key prefix ("rq")
-- ARGV[2]  queue name
-- ARGV[3]  batch: at most this many entries are read from each sorted set
-- ARGV[4]  default max_stalled (a job's own max_stalled field wins)
-- ARGV[5]  restart grace in seconds: uncounted leases wait until the server has been primary this long
-- ARGV[6]  failure TTL in seconds for jobs without their own failure_ttl
-- ARGV[7]  "1" for a dry run: verdicts are computed, nothing is written
-- ARGV[8]  offset into the expired leases of KEYS[1]: how many the caller saw left in
--          place by earlier calls of the same sweep (deferred ones; every one in a dry run)
-- ARGV[9]  the same offset into the expired entries of KEYS[2]
-- ARGV[10] the same offset into the expired leases of KEYS[5]
--
-- A lease of KEYS[1] is the job's: the execution that holds it is the job's
-- `lease_execution`. A lease of KEYS[5] (granted by a 0.2.0 worker during an upgrade) and
-- an entry of KEYS[2] name their execution themselves. RQ's records of the execution
-- are named by "<job_id>:<execution_id>" (its <member> below) either way.
--
-- Keys derived from ARGV[1] (prefix), ARGV[2] (queue), each job id and its execution:
--   <prefix>:job:<job_id>                       the job hash (read; written by verdicts)
--   <prefix>:execution:<member>                 RQ's execution record (deleted)
--   <prefix>:executions:<job_id>                RQ's executions of the job (member removed; read
--                                               when a job's lease names no execution)
--   <prefix>:worker:<worker_name>:executions    RQ's executions of the worker (member removed)
--   <prefix>:queue:<queue>                      the queue (requeued jobs pushed at the front;
--                                               read with LPOS for a granted, never-started job)
--   <prefix>:queue:<queue>:intermediate         RQ's intermediate list (the entry of a granted,
--                                               never-started job removed)
--   <prefix>:queues                             RQ's set of queues (the queue registered)
--   <prefix>:failed:<queue>                     RQ's FailedJobRegistry (dead letters)
--   <prefix>:epoch:primaries                    when this process became primary (_epoch.lua)
--   <prefix>:epoch:alive                        when each process was last seen serving as
--                                               primary (_epoch.lua; read, and written at most
--                                               once a second)
--
-- Expired entries are read from three places: rq-epoch's leases (deadline <= TIME), the
-- leases of 0.2.0 workers (KEYS[5], judged alike), and RQ's StartedJobRegistry entries
-- with a finite expired score, which only stock workers write (rq-epoch gives its own
-- entries the score +inf). The latter carry no stamp of rq-epoch's and are never counted.
--
-- Verdicts (docs: the verdict table):
--   ghost      job hash gone                      -> entry removed
--   corrupt    member malformed / job not a hash  -> entry removed, foreign key untouched
--   settled    job no longer started, or another  -> entry removed, job untouched
--              execution holds it
--   exempt     stamp missing or another process   -> requeued at front, stalled unchanged
--              not seen alive after the deadline
--   stopping   marked stopping by its execution   -> requeued at front, stalled unchanged
--              (stopmark.lua), deadline within
--              the stop window after the mark
--   recovered  counted, budget left               -> stalled + 1, requeued at front
--   dead       counted, budget gone               -> stalled + 1, failed, awaiting finish
--   deferred   uncounted, but the server is younger than the grace: left for later
--
-- Counted: the stamp is this process, or another process whose record in
-- <prefix>:epoch:alive (note_alive in _epoch.lua) shows it serving as primary after the
-- lease's deadline: the lease ran out under a live server, and a restart or failover only
-- delayed its verdict. Such a lease is judged at once, without the restart grace. Its
-- stall is recorded under the stamp's process in stall_epochs. Each call that judges also
-- notes this process alive (at most once a second).
--
-- Stopping: a worker told to stop marks its lease (the job's field stop_mark,
-- "<execution_id> <marked_at> <until>", server TIME, see stopmark.lua). A lease that ran out
-- while so marked by the execution that held it, from the mark to the end of the stop window
-- (`until`), was cut off by its worker's own stop (a deploy), not by a death: it is requeued
-- uncounted, whatever its stamp, once it is not deferred (the grace applies as to any lease
-- stamped by another process). Its requeue adds one to `stopping_recoveries` and removes the
-- mark. An unmarked lease, or one that ran out after the window, is judged as any other.
--
-- RQ's records of the execution go with the entry. For a ghost or a job key of another
-- type, whose lease names no execution that can be read, those are the records of every
-- execution in <prefix>:executions:<job_id> (RQ's executions of the job).
--
-- A job's lease whose `lease_execution` names an execution that holds a lease of KEYS[5]
-- (a 0.2.0 worker granted the job again, after this lease) is settled: only the entry is
-- removed. One whose job names no execution is settled the same way.
--
-- When a verdict takes a lease from an execution that may still be running (exempt,
-- recovered, dead, or settled because a newer execution holds the job), the job hash
-- gets the field "taken:<execution_id>" = verdict, in the HSET the verdict writes anyway.
-- The extend and commit scripts read it: the execution learns, at its next heartbeat or
-- commit, which verdict took its lease.
--
-- The restart grace counts from when this server process began serving the dataset as
-- primary (restart or promotion), as recorded in <prefix>:epoch:primaries (see
-- primary_epoch in _epoch.lua), not from its uptime: a promoted replica has been up long.
-- A process that was primary before (demoted, then promoted again) also defers leases
-- stamped with its own run_id during the grace: they may date from its earlier term.
-- A server that is not a primary, or a primary that had replicas in its epoch and has
-- none online now (demoted or cut off), judges nothing: no verdict, no write.
--
-- Returns the reply of _sweep.lua: {run_id, uptime, now, role, primary_age,
-- replicas_online, replicas_expected, first_seen_as_primary, more, left_leases,
-- left_stock, left_legacy, n, records} (the n records in one string, a line each);
-- left_leases / left_stock / left_legacy are how many entries this call read from KEYS[1] /
-- KEYS[2] / KEYS[5] and left in place (the caller adds them to its offsets). A record's member is the entry as it was read: the
-- job id for KEYS[1], "<job_id>:<execution_id>" for KEYS[2] and KEYS[5].
--
-- In Python the reply is read by rq_epoch/verbs.py (sweep, SweepReply).

-- @include _epoch.lua
-- @include _sweep.lua

local leases_key, wip_key, finishing_key, stats_key, legacy_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local run_id, uptime, err = current_epoch()
if err then return redis.error_reply(err) end

local prefix = ARGV[1]
local queue = ARGV[2]
local batch = tonumber(ARGV[3])
local default_max = tonumber(ARGV[4])
local grace = tonumber(ARGV[5])
local default_failure_ttl = tonumber(ARGV[6])
local dry = ARGV[7] == '1'
local lease_offset = tonumber(ARGV[8]) or 0
local stock_offset = tonumber(ARGV[9]) or 0
local legacy_offset = tonumber(ARGV[10]) or 0
local now = server_now()
local primary, judges = judging_primary(run_id, uptime, now, prefix, dry)
if not judges then return reply(run_id, uptime, now, primary, 0, 0, 0, 0) end
if not dry then note_alive(prefix, run_id, uptime, now, primary) end

local queue_key = prefix .. ':queue:' .. queue
-- Where an entry was read: a job's lease, a 0.2.0 lease, RQ's registry (a stock worker).
local LEASE, LEGACY, STOCK = 1, 2, 3
local source_key = {leases_key, legacy_key, wip_key}
local legacy_left = rcall('EXISTS', legacy_key) == 1
-- Entries read and left in place by this call.
local left = 0

-- The writes of each loop below that remove entries of sorted sets and sets, delete RQ's
-- execution records or push jobs to the queue are gathered and sent once the loop is done
-- (send_gathered in _sweep.lua). No verdict of the same loop reads them: each entry of a
-- loop names another execution, and what a verdict reads of a job it has judged before in
-- the same loop (a 0.2.0 lease and RQ's entry of one job) is the job hash, written at once.
-- The LPOS of a never-started job's check reads the queue, but only for the entry that
-- names the job's own execution, which comes once per loop.

-- Forget the entry as it was read (and RQ's entry of the same name, for a corrupt one).
local function drop_entry(kind, member, corrupt)
  gather('ZREM', source_key[kind], member)
  if corrupt and kind == LEGACY then gather('ZREM', wip_key, member) end
end

-- Forget the entry as it was read (when kind is given) and RQ's records of the execution
-- <job_id>:<exec_id>. Called for every lease a verdict takes, so its gathering is written
-- out here (gathered_for: no call per member).
local function drop(kind, member, job_id, exec_id)
  if kind then
    local key = source_key[kind]
    local entries = gathered[key] or gathered_for('ZREM', key)
    entries[#entries + 1] = member
  end
  local execution = job_id .. ':' .. exec_id
  local wip_entries = gathered[wip_key] or gathered_for('ZREM', wip_key)
  wip_entries[#wip_entries + 1] = execution
  local execution_key = prefix .. ':execution:' .. execution
  local worker_name = rcall('HGET', execution_key, 'worker_name')
  gathered_dels[#gathered_dels + 1] = execution_key
  rcall('ZREM', prefix .. ':executions:' .. job_id, exec_id)
  if worker_name and worker_name ~= '' then
    local worker_key = prefix .. ':worker:' .. worker_name .. ':executions'
    local executions = gathered[worker_key] or gathered_for('SREM', worker_key)
    executions[#executions + 1] = execution
  end
end

-- Forget RQ's records of the execution <job_id>:<exec_id>.
local function forget(job_id, exec_id) drop(nil, nil, job_id, exec_id) end

-- Forget RQ's records of every execution of a job whose lease names none that can be read.
local function forget_all(job_id)
  for _, e in ipairs(rcall('ZRANGE', prefix .. ':executions:' .. job_id, 0, batch - 1)) do forget(job_id, e) end
end

local function bury(job_key, job_id, stalled, epochs, taken_field)
  local ttl = tonumber(rcall('HGET', job_key, 'failure_ttl'))
  if ttl == nil or ttl <= 0 then ttl = default_failure_ttl end
  rcall('HSET', job_key, 'status', 'failed', 'stall_dead', '1', 'stalled', stalled, 'stall_epochs', epochs,
             taken_field, 'dead')
  rcall('ZADD', prefix .. ':failed:' .. queue, now + ttl, job_id)
  rcall('ZADD', finishing_key, 0, queue .. '|' .. job_id)
end

-- Whether a lease stamped by another process ran out while that process was serving as
-- primary: its deadline (the lease's score, that process's TIME) falls within its recorded
-- term, before its last sign of life (seen_alive / died_under in _epoch.lua). Each stamp's
-- record is read once per call.
local alive_records = {}
local function died_before(kind, member, stamp)
  if not stamp or stamp == '' or stamp == run_id then return false end
  local seen = alive_records[stamp]
  if seen == nil then
    local last, first = seen_alive(prefix, stamp)
    seen = last and {last = last, first = first} or false
    alive_records[stamp] = seen
  end
  if not seen then return false end
  return died_under(tonumber(rcall('ZSCORE', source_key[kind], member)), seen.last, seen.first)
end

-- Whether a lease marked stopping (mark: the job's stop_mark field) ran out within its stop
-- window: marked by this same execution, its deadline from the mark to the window's end.
local function stopped_in_window(kind, member, exec_id, mark)
  local marked_by, marked_at, window_end = string.match(mark, '^(%S+) (%S+) (%S+)$')
  if marked_by ~= exec_id then return false end
  marked_at, window_end = tonumber(marked_at), tonumber(window_end)
  local deadline = tonumber(rcall('ZSCORE', source_key[kind], member))
  return marked_at ~= nil and window_end ~= nil and deadline ~= nil and marked_at <= deadline and deadline <= window_end
end

-- True while the leases being judged hold no ':' (checked once for the batch in the loop below).
local leases_colon_free = false

local function judge(kind, member)
  local job_id, exec_id
  if kind == LEASE then
    if member ~= '' and (leases_colon_free or not find(member, ':', 1, true)) then job_id = member end
  else
    job_id, exec_id = string.match(member, '^([^:]+):([^:]+)$')
  end
  if not job_id then
    if not dry then drop_entry(kind, member, true) end
    return record(member, 'corrupt', 0, 0, '', dry)
  end
  local job_key = prefix .. ':job:' .. job_id
  -- One read for the common case; the key's type is only asked when the read fails.
  local f = rpcall('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled', 'lease_execution',
                        'exempt_recoveries', 'stall_epochs', 'stop_mark', 'stopping_recoveries')
  if f.err then
    if not dry then
      drop_entry(kind, member, true)
      if kind == LEASE then forget_all(job_id) end
    end
    return record(member, 'corrupt', 0, 0, '', dry)
  end
  if not f[1] and rcall('EXISTS', job_key) == 0 then
    if not dry then
      drop_entry(kind, member)
      if exec_id then forget(job_id, exec_id) else forget_all(job_id) end
    end
    return record(member, 'ghost', 0, 0, '', dry)
  end
  local status, epoch, lease_execution = f[1], f[2], f[5]
  -- Most jobs have neither field: no call for those.
  local stalled, max_stalled = 0, default_max
  if f[3] then stalled = count_of(f[3], 0, 0) end
  if f[4] then max_stalled = count_of(f[4], 1, default_max) end
  if kind == STOCK then epoch = false end
  if kind == LEASE then
    exec_id = lease_execution
    if not exec_id or (legacy_left and rcall('ZSCORE', legacy_key, job_id .. ':' .. exec_id)) then
      -- No execution named, or the one named holds a 0.2.0 lease granted after this one.
      if not dry then drop_entry(kind, member) end
      return record(member, 'settled', stalled, max_stalled, epoch, dry)
    end
  end
  local taken_field = 'taken:' .. exec_id

  local never_started = false
  if status == 'started' then
    if kind == LEGACY and lease_execution and lease_execution ~= exec_id then
      if not dry then
        drop(kind, member, job_id, exec_id)
        rcall('HSET', job_key, taken_field, 'settled')
      end
      return record(member, 'settled', stalled, max_stalled, epoch, dry)
    end
  elseif status == 'queued' and kind ~= STOCK and lease_execution == exec_id
      and not rcall('LPOS', queue_key, job_id) then
    -- Granted, then the worker died before the job started: it never ran, so it did
    -- not stall. Requeued uncounted.
    never_started = true
  else
    if not dry then drop(kind, member, job_id, exec_id) end
    return record(member, 'settled', stalled, max_stalled, epoch, dry)
  end

  -- Counted: stamped by this process, or by one whose record shows it still serving as
  -- primary after the lease ran out (died_before: the restart only delayed the verdict,
  -- so no grace either).
  local here = (not never_started) and epoch and epoch == run_id
  local counted = here or ((not never_started) and died_before(kind, member, epoch))
  if (here and primary.returning and primary.age < grace) or (not counted and primary.age < grace) then
    -- Uncounted, or stamped by this process in an earlier term as primary: wait for the grace.
    left = left + 1
    return record(member, 'deferred', stalled, max_stalled, epoch, dry)
  end
  if f[8] and kind ~= STOCK and stopped_in_window(kind, member, exec_id, f[8]) then
    if not dry then
      drop(kind, member, job_id, exec_id)
      rcall('HDEL', job_key, 'stop_mark')
      requeue(prefix, queue_key, job_key, job_id, never_started, true, 'stopping_recoveries', (tonumber(f[9]) or 0) + 1, taken_field, 'stopping')
    end
    return record(member, 'stopping', stalled, max_stalled, epoch, dry)
  end
  if not counted then
    if not dry then
      drop(kind, member, job_id, exec_id)
      requeue(prefix, queue_key, job_key, job_id, never_started, true, 'exempt_recoveries', (tonumber(f[6]) or 0) + 1, taken_field, 'exempt')
    end
    return record(member, 'exempt', stalled, max_stalled, epoch, dry)
  end

  stalled = stalled + 1
  local epochs = f[7]
  if epochs and epochs ~= '' then epochs = epochs .. ',' .. epoch else epochs = epoch end
  if stalled < max_stalled then
    if not dry then
      drop(kind, member, job_id, exec_id)
      requeue(prefix, queue_key, job_key, job_id, false, true, 'stalled', stalled, 'stall_epochs', epochs, taken_field, 'recovered')
    end
    return record(member, 'recovered', stalled, max_stalled, epoch, dry)
  end
  if not dry then
    drop(kind, member, job_id, exec_id)
    bury(job_key, job_id, stalled, epochs, taken_field)
  end
  return record(member, 'dead', stalled, max_stalled, epoch, dry)
end

local leases, joined = members_of(rcall('ZRANGEBYSCORE', leases_key, '-inf', now, 'LIMIT', lease_offset, batch))
leases_colon_free = not find(joined, ':', 1, true)
for _, member in ipairs(leases) do judge(LEASE, member) end
send_gathered()
local left_leases = left
if dry then left_leases = #leases end

-- Leases of 0.2.0 workers, left from before an upgrade or written by those still running.
left = 0
local legacy = {}
if legacy_left then
  legacy = members_of(rcall('ZRANGEBYSCORE', legacy_key, '-inf', now, 'LIMIT', legacy_offset, batch))
  for _, member in ipairs(legacy) do judge(LEGACY, member) end
  send_gathered()
end
local left_legacy = left
if dry then left_legacy = #legacy end

-- Is RQ's entry <job_id>:<exec_id> the execution of a lease that rq-epoch manages?
local function managed(member)
  if legacy_left and rcall('ZSCORE', legacy_key, member) then return true end
  local job_id, exec_id = string.match(member, '^([^:]+):([^:]+)$')
  if not job_id or not rcall('ZSCORE', leases_key, job_id) then return false end
  return rpcall('HGET', prefix .. ':job:' .. job_id, 'lease_execution') == exec_id
end

-- Stock workers' entries: finite, expired scores in RQ's registry, not managed by us.
left = 0
local stock = members_of(rcall('ZRANGEBYSCORE', wip_key, '-inf', now, 'LIMIT', stock_offset, batch))
for _, member in ipairs(stock) do
  if managed(member) then left = left + 1 else judge(STOCK, member) end
end
send_gathered()
local left_stock = left
if dry then left_stock = #stock end

if not dry then
  count_verdicts(stats_key)
  rcall('HSET', stats_key, 'last_sweep', tostring(now))
end

local more = 0
if #leases >= batch or #stock >= batch or #legacy >= batch then more = 1 end
return reply(run_id, uptime, now, primary, more, left_leases, left_stock, left_legacy)
